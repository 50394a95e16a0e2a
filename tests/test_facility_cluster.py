"""make_cluster and the worker environment: job parameters, secrets by name only, real Dask workers.

HTCondor cannot run here: its generated submit description is checked. Local and scheduler-address
clusters are real Dask clusters (the SLURM path runs for real in test_slurm.py).
"""

from __future__ import annotations

import os

import dask.config
import pytest

from coffea_sonic.config import model_urls
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.facility.cluster import make_cluster
from coffea_sonic.facility.environment import worker_environment

TOKEN = "tok-3f9a-do-not-print"


@pytest.fixture
def facility_env(monkeypatch):
    """A submitting environment as a user would have it: endpoints, a CA path, a token."""
    for name in list(os.environ):
        if name.startswith("COFFEA_SONIC_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COFFEA_SONIC_MODEL_JET_TAGGER", "triton+grpc://gpu1.example.org:8001/jet_tagger")
    monkeypatch.setenv("COFFEA_SONIC_CA_FILE", "/etc/grid-security/ca.pem")
    monkeypatch.setenv("SONIC_TOKEN", TOKEN)
    monkeypatch.setenv("COFFEA_SONIC_TOKEN_ENV", "SONIC_TOKEN")
    with dask.config.set({"coffea_sonic.models.particlenet_lite": ["triton+grpc://gpu2:8001/particlenet_lite"]}):
        yield


def test_worker_environment_splits_plain_settings_from_secret_names(facility_env):
    env = worker_environment()
    assert env.values["COFFEA_SONIC_MODEL_JET_TAGGER"] == "triton+grpc://gpu1.example.org:8001/jet_tagger"
    assert env.values["COFFEA_SONIC_CA_FILE"] == "/etc/grid-security/ca.pem"
    assert env.values["DASK_COFFEA_SONIC__MODELS__PARTICLENET_LITE"] == \
        "['triton+grpc://gpu2:8001/particlenet_lite']"
    assert env.forwarded == ("SONIC_TOKEN",)
    assert TOKEN not in repr(env)


def test_dask_config_setting_survives_the_trip_through_the_environment(facility_env, monkeypatch):
    name, value = next((k, v) for k, v in worker_environment().values.items() if k.startswith("DASK_"))
    collected = dask.config.collect_env({name: value})
    with dask.config.set(collected):
        assert model_urls("particlenet_lite") == ["triton+grpc://gpu2:8001/particlenet_lite"]


def test_secret_values_are_refused_in_the_plain_mapping():
    with pytest.raises(ConfigurationError, match="pass its name only"):
        worker_environment({"MY_API_KEY": "abc"}, include_settings=False)
    with pytest.raises(ConfigurationError, match="not an environment variable name"):
        worker_environment(["bad name"], include_settings=False)


def test_slurm_job_script_exports_settings_and_names_the_token_only(facility_env):
    with make_cluster("slurm", workers=0, loopback=True, queue="gpu-short", account="cms",
                      walltime="00:30:00", memory="3GiB") as cluster:
        script = cluster.job_script()
    assert TOKEN not in script
    assert "export COFFEA_SONIC_MODEL_JET_TAGGER=triton+grpc://gpu1.example.org:8001/jet_tagger" in script
    assert '"${SONIC_TOKEN:-}"' in script and "#SBATCH --export=ALL" in script
    for directive in ("#SBATCH -p gpu-short", "#SBATCH -A cms", "#SBATCH -t 00:30:00",
                      "#SBATCH --cpus-per-task=1", "#SBATCH -n 1"):
        assert directive in script
    assert "--nthreads 1" in script and "--host 127.0.0.1" in script


def test_htcondor_submit_description_takes_the_token_from_the_submitter_env(facility_env):
    with make_cluster("htcondor", workers=0, loopback=True, walltime="02:00:00",
                      memory="2GiB", disk="4GiB", queue="longlunch") as cluster:
        script = cluster.job_script()
    assert TOKEN not in script
    environment = next(line for line in script.splitlines() if line.startswith("environment ="))
    assert "SONIC_TOKEN='$ENV(SONIC_TOKEN)'" in environment
    assert "COFFEA_SONIC_MODEL_JET_TAGGER='triton+grpc://gpu1.example.org:8001/jet_tagger'" in environment
    assert "+MaxRuntime = 7200" in script and '+JobFlavour = "longlunch"' in script
    assert "MY.DaskWorkerCores = 1" in script
    assert "RequestMemory" in script and "MY.DaskWorkerDisk = 4294967296" in script


def test_unknown_kind_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="not one of local, slurm, htcondor"):
        make_cluster("kubernetes", workers=1)


def test_local_workers_get_settings_and_the_forwarded_token(facility_env):
    def seen() -> tuple:
        from coffea_sonic.config import model_urls

        return (os.environ.get("SONIC_TOKEN") == TOKEN, model_urls("jet_tagger"),
                model_urls("particlenet_lite"))

    with make_cluster("local", workers=1) as cluster:
        (result,) = cluster.client.run(seen).values()
        assert cluster.n_workers() == 1
    assert result == (True, ["triton+grpc://gpu1.example.org:8001/jet_tagger"],
                      ["triton+grpc://gpu2:8001/particlenet_lite"])


def test_scheduler_address_gets_settings_by_plugin_but_never_the_token(monkeypatch):
    from distributed import LocalCluster

    for name in list(os.environ):
        if name.startswith("COFFEA_SONIC_"):
            monkeypatch.delenv(name)
    with LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=":0") as existing:
        # the facility's workers were started without our settings
        monkeypatch.setenv("COFFEA_SONIC_SERVERS", "gpu9.example.org:8001")
        with make_cluster(existing.scheduler_address, workers=1, env=["SONIC_TOKEN_X"]) as cluster:
            assert cluster.kind == "address"
            (servers,) = cluster.client.run(lambda: os.environ.get("COFFEA_SONIC_SERVERS")).values()
            (token,) = cluster.client.run(lambda: os.environ.get("SONIC_TOKEN_X")).values()
    assert servers == "gpu9.example.org:8001"
    assert token is None


# -- worker memory sized from the machine ------------------------------------------------------
def test_local_worker_memory_is_the_machines_less_a_reserve_shared_by_the_workers(caplog):
    from coffea_sonic.facility.cluster import (LOCAL_RESERVE_BYTES, LOCAL_RESERVE_FRACTION,
                                               local_worker_memory)

    gib = 2**30
    # a 16-core GPU node (128 GiB): 15 workers get ~7.7 GiB each, not a fixed 2 GiB
    assert local_worker_memory(15, total_bytes=128 * gib) == int(128 * gib * 0.9) // 15
    # small machines keep at least LOCAL_RESERVE_BYTES for the rest
    assert local_worker_memory(2, total_bytes=8 * gib) == (8 * gib - LOCAL_RESERVE_BYTES) // 2
    assert LOCAL_RESERVE_FRACTION * 128 * gib > LOCAL_RESERVE_BYTES
    with caplog.at_level("WARNING", logger="coffea_sonic.facility.cluster"):
        local_worker_memory(64, total_bytes=16 * gib)
    assert "ask for fewer workers" in caplog.text
    with pytest.raises(ConfigurationError, match="workers must be >= 1"):
        local_worker_memory(0)


def test_local_workers_get_the_machines_memory_by_default_and_what_is_asked_otherwise():
    from distributed.system import MEMORY_LIMIT

    from coffea_sonic.facility.cluster import local_worker_memory

    with make_cluster("local", workers=2) as cluster:
        limits = cluster.worker_memory()
        assert sorted(limits.values()) == [local_worker_memory(2)] * 2
        assert sum(limits.values()) < MEMORY_LIMIT
        assert "GiB/worker" in repr(cluster)
        # each worker's own memory manager has that limit, and Dask's thresholds on top of it
        (state,) = set(cluster.client.run(
            lambda dask_worker: (dask_worker.memory_manager.memory_limit,
                                 dask_worker.memory_manager.memory_pause_fraction)).values())
    assert state[0] == local_worker_memory(2) and state[1] == pytest.approx(0.8)
    with make_cluster("local", workers=1, memory="1GiB") as cluster:
        assert list(cluster.worker_memory().values()) == [2**30]


# -- the site's dask-jobqueue configuration applies ---------------------------------------------
SITE_JOBQUEUE_YAML = """\
jobqueue:
  slurm:
    queue: site-partition
    account: site-account
    walltime: "03:00:00"
    cores: 4
    memory: 8GiB
    processes: 2
    job-script-prologue:
      - module load site-python/3.11
      - export SITE_SCRATCH=/scratch/$USER
    job-extra-directives:
      - --qos=site-qos
  htcondor:
    disk: 7GiB
    memory: 3GiB
    cores: 1
    job-extra-directives:
      environment: '"SITE_VAR=1"'
      +AccountingGroup: '"group_site"'
"""

_PRINT_JOB_SCRIPTS = """\
import sys
from coffea_sonic.facility.cluster import make_cluster
for kind in ("slurm", "htcondor"):
    options = dict(queue=sys.argv[1]) if len(sys.argv) > 1 else {}
    with make_cluster(kind, workers=0, loopback=True, **options) as cluster:
        print(cluster.job_script())
        print("=====")
"""


def _site_job_scripts(tmp_path, *arguments: str) -> tuple[str, str]:
    """Job scripts made in a fresh process whose Dask reads the site's jobqueue.yaml."""
    import subprocess
    import sys

    site = tmp_path / "site-dask"
    site.mkdir(exist_ok=True)
    (site / "jobqueue.yaml").write_text(SITE_JOBQUEUE_YAML)
    env = {**os.environ, "DASK_CONFIG": str(site)}
    completed = subprocess.run([sys.executable, "-c", _PRINT_JOB_SCRIPTS, *arguments],
                               capture_output=True, text=True, timeout=120, env=env)
    assert completed.returncode == 0, completed.stderr
    slurm, htcondor, _ = completed.stdout.split("=====\n")
    return slurm, htcondor


def test_site_jobqueue_yaml_shapes_the_slurm_job_script(facility_env, tmp_path):
    script, _ = _site_job_scripts(tmp_path)
    for directive in ("#SBATCH -p site-partition", "#SBATCH -A site-account",
                      "#SBATCH -t 03:00:00", "#SBATCH --qos=site-qos", "#SBATCH --export=ALL",
                      "#SBATCH --cpus-per-task=4"):
        assert directive in script, script
    assert "--nworkers 2" in script and "#SBATCH --mem=" in script
    lines = script.splitlines()
    site_line = lines.index("module load site-python/3.11")
    ours = lines.index("export COFFEA_SONIC_MODEL_JET_TAGGER=triton+grpc://gpu1.example.org:8001/jet_tagger")
    assert site_line < lines.index("export SITE_SCRATCH=/scratch/$USER") < ours
    assert TOKEN not in script


def test_arguments_given_win_over_the_site_and_the_rest_stays_the_sites(facility_env, tmp_path):
    script, _ = _site_job_scripts(tmp_path, "express")
    assert "#SBATCH -p express" in script and "site-partition" not in script
    assert "#SBATCH -t 03:00:00" in script and "module load site-python/3.11" in script


def test_site_htcondor_environment_and_disk_are_kept(facility_env, tmp_path):
    _, submit = _site_job_scripts(tmp_path)
    environment = next(line for line in submit.splitlines() if line.startswith("environment ="))
    assert "SITE_VAR=1" in environment and "SONIC_TOKEN='$ENV(SONIC_TOKEN)'" in environment
    assert '+AccountingGroup = "group_site"' in submit
    assert "MY.DaskWorkerDisk = 7516192768" in submit
    assert "+MaxRuntime" not in submit  # no walltime asked, none invented


def test_without_site_configuration_workers_are_single_core_jobs_of_batch_memory(facility_env):
    from coffea_sonic.facility.cluster import BATCH_MEMORY

    with dask.config.set({"jobqueue.slurm.cores": None, "jobqueue.slurm.memory": None,
                          "jobqueue.slurm.processes": None}):
        with make_cluster("slurm", workers=0, loopback=True) as cluster:
            script = cluster.job_script()
    assert "#SBATCH --cpus-per-task=1" in script and "--nthreads 1" in script
    assert "--nworkers" not in script  # one worker process per job
    assert f"--memory-limit {BATCH_MEMORY.replace('GiB', '.00GiB')}" in script
    assert "#SBATCH -t 00:30:00" in script  # dask-jobqueue's own default, not one of ours
