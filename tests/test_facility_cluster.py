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
    monkeypatch.setenv("COFFEA_SONIC_SSL_CA", "/etc/grid-security/ca.pem")
    monkeypatch.setenv("SONIC_TOKEN", TOKEN)
    monkeypatch.setenv("COFFEA_SONIC_TOKEN_ENV", "SONIC_TOKEN")
    with dask.config.set({"coffea_sonic.models.particlenet_lite": ["triton+grpc://gpu2:8001/particlenet_lite"]}):
        yield


def test_worker_environment_splits_plain_settings_from_secret_names(facility_env):
    env = worker_environment()
    assert env.values["COFFEA_SONIC_MODEL_JET_TAGGER"] == "triton+grpc://gpu1.example.org:8001/jet_tagger"
    assert env.values["COFFEA_SONIC_SSL_CA"] == "/etc/grid-security/ca.pem"
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
