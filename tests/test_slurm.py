"""The facility path on a real SLURM: Dask workers as SLURM jobs run the example analysis.

A session fixture starts a single-node SLURM with the project's own ``scripts/slurm/start.sh``
(as root; installs slurm-wlm and munge with apt if missing) and stops it afterwards only if it
started it. The analysis is ``coffea_sonic.examples.jet_tagging.JetTaggingProcessor`` through
``coffea.processor.Runner`` + ``DaskExecutor`` against the embedded Triton server; the SLURM
workers reach it through a bearer-token gateway, the token forwarded by variable name only.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from coffea_sonic.errors import ClusterStartError
from coffea_sonic.facility.check import CheckOptions, check_on_workers
from coffea_sonic.facility.cluster import make_cluster
from coffea_sonic.facility.gateway import TokenGateway
from helpers import assert_same_histograms

REPO = Path(__file__).resolve().parents[1]
SLURM_DIR = Path(os.environ.get("TMPDIR", "/tmp")) / "coffea-sonic-slurm-tests"
TOKEN_ENV = "COFFEA_SONIC_TEST_TOKEN"
EVENTS_PER_DATASET = 3000
CHUNKSIZE = 750


def _slurm_up() -> bool:
    if not shutil.which("scontrol"):
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    return "UP" in ping.stdout


@pytest.fixture(scope="session")
def slurm():
    """A working SLURM controller and node on this machine (started here if needed)."""
    started = False
    if not _slurm_up():
        if os.geteuid() != 0:
            pytest.skip("no SLURM running and not root: scripts/slurm/start.sh must run as root "
                        "to install slurm-wlm/munge and start the daemons")
        if not (shutil.which("slurmctld") or shutil.which("apt-get")):
            pytest.skip("no SLURM installed and no apt-get to install slurm-wlm/munge")
        env = {**os.environ, "SLURM_DIR": str(SLURM_DIR)}
        result = subprocess.run([str(REPO / "scripts/slurm/start.sh")], capture_output=True,
                                text=True, timeout=600, env=env)
        assert result.returncode == 0, f"scripts/slurm/start.sh failed:\n{result.stdout}\n{result.stderr}"
        started = True
    yield
    if started:
        subprocess.run([str(REPO / "scripts/slurm/stop.sh")], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "SLURM_DIR": str(SLURM_DIR)})


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from coffea_sonic.data.synthetic import write_sample

    return write_sample(tmp_path_factory.mktemp("slurm-sample"), events=EVENTS_PER_DATASET,
                        files=2, seed=3)


@pytest.fixture(scope="module")
def token(monkeypatch_module):
    value = secrets.token_urlsafe(24)
    monkeypatch_module.setenv(TOKEN_ENV, value)
    return value


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def gateway(triton_server, token):
    with TokenGateway(triton_server.grpc_address, token_env=TOKEN_ENV) as running:
        yield running


def _run_analysis(client, fileset, server_base: str, *, with_token: bool) -> dict:
    from coffea import processor
    from coffea.nanoevents import NanoAODSchema

    from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
    from coffea_sonic.core.secrets import Secret

    options = {"headers": {"authorization": Secret.bearer_from_env(TOKEN_ENV)}} if with_token else {}
    analysis = JetTaggingProcessor(server_base, **options)
    # the synthetic files have no leptons: quiet NanoAODSchema's cross-reference warnings
    schema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    runner = processor.Runner(
        # no task retries: a lost chunk must fail the run, not be redone behind the client's back
        executor=processor.DaskExecutor(client=client, status=False, retries=0),
        schema=schema, chunksize=CHUNKSIZE, savemetrics=False)
    return runner(fileset, processor_instance=analysis, treename="Events")


def _assert_same_output(got: dict, want: dict) -> None:
    """The same cutflow, and every bin (values and variances) of every histogram, particlenet's
    scores too: equal, not close."""
    assert got["cutflow"] == want["cutflow"]
    assert_same_histograms(got, want)


@pytest.fixture(scope="module")
def local_reference(triton_server, sample):
    """The same analysis on a LocalCluster, straight to the server (no gateway, no token)."""
    with make_cluster("local", workers=2, include_settings=False) as cluster:
        return _run_analysis(cluster.client, sample, f"triton+grpc://{triton_server.grpc_address}",
                             with_token=False)


def test_slurm_workers_run_example_analysis_with_forwarded_token_like_local_cluster(
        slurm, sample, gateway, token, local_reference, tmp_path):
    logs = tmp_path / "jobs"
    with make_cluster("slurm", workers=2, env=[TOKEN_ENV], log_directory=logs,
                      timeout_s=120) as cluster:
        script = cluster.job_script()
        assert TOKEN_ENV in script and token not in script
        assert len(cluster.worker_jobs()) == 2, "each worker must be its own SLURM job"
        output = _run_analysis(cluster.client, sample, f"triton+grpc://{gateway.address}",
                               with_token=True)
        # the check, run from inside a SLURM job, sees the same healthy path
        reports = check_on_workers(cluster.client, [gateway.url("jet_tagger")],
                                   CheckOptions(token_env=TOKEN_ENV, pings=2))
    _assert_same_output(output, local_reference)
    assert sum(entry["events"] for entry in output["cutflow"].values()) == 2 * EVENTS_PER_DATASET
    assert gateway.accepted > 0
    assert all(report.ok for per_worker in reports.values() for report in per_worker), reports
    assert any(logs.iterdir()), "the worker jobs wrote no logs"
    for log in logs.iterdir():
        assert token not in log.read_text(errors="replace"), f"token leaked into {log}"


def test_scancelled_worker_job_loses_nothing(slurm, sample, triton_server, local_reference):
    from coffea_sonic.examples.jet_tagging import JetTaggingProcessor  # noqa: F401 (fail early)

    with make_cluster("slurm", workers=2, include_settings=False, timeout_s=120) as cluster:
        client = cluster.client
        result: dict = {}

        def run() -> None:
            try:
                result["output"] = _run_analysis(
                    client, sample, f"triton+grpc://{triton_server.grpc_address}", with_token=False)
            except BaseException as error:  # surfaced below
                result["error"] = error

        runner = threading.Thread(target=run)
        runner.start()
        # wait until a worker is busy with a chunk, then kill its batch job
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline and runner.is_alive():
            busy = [address for address, keys in client.processing().items()
                    if any(str(key).startswith("JetTaggingProcessor") for key in keys)]
            jobs = cluster.worker_jobs()
            victim = next((jobs[address] for address in busy if address in jobs), None)
            time.sleep(0.05)
        assert victim is not None, "no worker was ever busy: the run finished too fast to test"
        subprocess.run(["scancel", victim], check=True, timeout=30)
        runner.join(timeout=300)
        assert not runner.is_alive(), "the run did not finish after a worker job was cancelled"
        assert "error" not in result, f"the run failed after scancel: {result.get('error')!r}"
        queue = subprocess.run(["squeue", "-h", "-j", victim, "-o", "%T"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
        assert queue in ("", "CANCELLED", "COMPLETING"), f"job {victim} still {queue}"
        assert victim not in cluster.worker_jobs().values(), "the cancelled worker is still there"
    _assert_same_output(result["output"], local_reference)


def test_unstartable_workers_raise_cluster_start_error_with_queue_state(slurm):
    # a job that may not start for an hour: the wait must end with an explanation, not hang
    with pytest.raises(ClusterStartError) as raised:
        make_cluster("slurm", workers=1, include_settings=False, timeout_s=4,
                     job_extra_directives=["--begin=now+3600"])
    message = str(raised.value)
    assert "only 0 of 1 Dask workers" in message
    assert "squeue" in message and "PENDING" in message


def test_facility_notebook_runs_on_slurm_against_the_embedded_server(slurm, tmp_path, monkeypatch):
    from notebook_runner import run_notebook

    for name in list(os.environ):
        if name.startswith(("COFFEA_SONIC_", "DASK_COFFEA_SONIC")) or name == "SONIC_TOKEN":
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))  # no endpoints file yet
    text = run_notebook("02_facility.ipynb", tmp_path, EVENTS=3000, CLUSTER="slurm",
                        WORKDIR=str(tmp_path))
    assert "playing the facility" in text
    assert "2 of 2 server(s) OK" in text
    assert "kind='slurm', workers=2/2" in text and "workers -> batch jobs" in text
    assert "6000 events in" in text and "QUEUE us/EXEC" in text
    assert "0 rejected" in text
    assert (tmp_path / "facility.png").stat().st_size > 10_000


def test_site_jobqueue_yaml_reaches_a_real_slurm_worker_job(slurm, tmp_path, monkeypatch):
    """A site's jobqueue.yaml (partition, walltime, prologue) read by Dask's own loader: the job
    runs in that partition with that time limit and the site's prologue ran before the worker."""
    import dask.config

    (tmp_path / "jobqueue.yaml").write_text(
        "jobqueue:\n  slurm:\n    queue: debug\n    walltime: '00:17:00'\n"
        "    job-script-prologue:\n      - export SITE_PROLOGUE_RAN=yes-$SLURM_JOB_PARTITION\n")
    monkeypatch.setenv("COFFEA_SONIC_SERVERS", "gpu-site.example.org:8001")
    loaded = dask.config.collect(paths=[str(tmp_path)], env={})["jobqueue"]["slurm"]
    site = {f"jobqueue.slurm.{key}": value for key, value in loaded.items()}
    with dask.config.set(site), make_cluster("slurm", workers=1, timeout_s=120) as cluster:
        script = cluster.job_script()
        (job_id,) = cluster.worker_jobs().values()
        seen = cluster.client.run(lambda: (os.environ.get("SITE_PROLOGUE_RAN"),
                                           os.environ.get("COFFEA_SONIC_SERVERS")))
        listing = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%P %l"],
                                 capture_output=True, text=True, timeout=20).stdout.split()
    assert "#SBATCH -p debug" in script and "#SBATCH -t 00:17:00" in script
    assert list(seen.values()) == [("yes-debug", "gpu-site.example.org:8001")]
    assert listing == ["debug", "17:00"]
