"""Tree models in the client: the zoo's BDT pair served by name, the in-process tree engine, and
``fallback="cpu"`` for tree models (the zoo's and a fallback repository's), each version by its
own file; answers compared with XGBoost itself."""

from __future__ import annotations

import pickle
import socket

import numpy as np
import pytest
import xgboost

from coffea_sonic import LocalTritonServer, TritonModel
from coffea_sonic.engines import TreeEngine, fallback_engine
from coffea_sonic.errors import ConfigurationError, InputValidationError
from coffea_sonic.zoo.trees import tree_file, write_tree_model
from helpers import assert_sent_over

NAME = "reconstruction_bdt_xgb"


def _rows(seed: int, count: int = 500) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, 20)).astype(np.float32)


def _xgboost(version: int, rows: np.ndarray) -> np.ndarray:
    return xgboost.Booster(model_file=str(tree_file(NAME, version))).inplace_predict(rows)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def bdt_server():
    with LocalTritonServer(models=[NAME], device="cpu") as server:
        yield server


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_the_zoo_bdt_pair_is_served_by_name_each_version_answering_like_its_file(
        bdt_server, transport):
    rows = _rows(1)
    for version in (1, 2):
        url = (f"triton+http://{bdt_server.http_address}/{NAME}/{version}" if transport == "http"
               else bdt_server.url(NAME, version))
        model = TritonModel(url, transport="auto" if transport == "http" else transport,
                            retry={"max_attempts": 1})
        answer = assert_sent_over(transport, bdt_server,
                                  lambda: model({"input__0": rows}))["output__0"]
        np.testing.assert_allclose(answer[:, 1], _xgboost(version, rows), atol=1e-6)
        np.testing.assert_allclose(answer, TreeEngine.from_zoo(NAME, version)(
            {"input__0": rows})["output__0"], atol=0)
    assert np.abs(_xgboost(1, rows) - _xgboost(2, rows)).max() > 1e-3


def test_the_tree_engine_runs_a_repository_folder_survives_pickling_and_refuses_bad_rows(
        tmp_path):
    folder = write_tree_model(tmp_path, NAME)
    engine = TreeEngine.from_folder(folder)  # the newest version
    rows = _rows(2, 50)
    assert engine.version == 2
    np.testing.assert_allclose(engine({"input__0": rows})["output__0"][:, 1], _xgboost(2, rows),
                               atol=1e-6)
    copy = pickle.loads(pickle.dumps(TreeEngine.from_folder(folder, 1)))
    np.testing.assert_allclose(copy({"input__0": rows})["output__0"][:, 1], _xgboost(1, rows),
                               atol=1e-6)
    with pytest.raises(InputValidationError, match=r"input__0: expected \[rows, 20\], got \[50, 19\]"):
        engine({"input__0": rows[:, :19]})
    with pytest.raises(InputValidationError, match="takes one input, input__0"):
        engine({"features": rows})
    with pytest.raises(ConfigurationError, match=r"has versions \[1, 2\], not 3"):
        TreeEngine.from_folder(folder, 3)


def test_fallback_cpu_runs_each_version_of_the_zoo_bdt_when_no_server_answers():
    rows = _rows(3, 200)
    dead = f"triton+grpc://127.0.0.1:{_closed_port()}/{NAME}"
    for version in (1, 2):
        model = TritonModel(f"{dead}/{version}", fallback="cpu", connect_timeout_s=2,
                            retry={"total_s": 2})
        answer = model({"input__0": rows})["output__0"]
        np.testing.assert_allclose(answer[:, 1], _xgboost(version, rows), atol=1e-6)
        assert model.stats.fallback_rows == 200


def test_fallback_cpu_runs_a_fil_model_of_the_fallback_repository(tmp_path, monkeypatch):
    write_tree_model(tmp_path / "repo", NAME)
    (tmp_path / "repo" / NAME).rename(tmp_path / "repo" / "ttbar_bdt")
    config = tmp_path / "repo" / "ttbar_bdt" / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{NAME}"', 'name: "ttbar_bdt"'))
    monkeypatch.setenv("COFFEA_SONIC_FALLBACK_REPOSITORY", str(tmp_path / "repo"))
    rows = _rows(4, 100)
    dead = f"triton+grpc://127.0.0.1:{_closed_port()}/ttbar_bdt/1"
    model = TritonModel(dead, fallback="cpu", connect_timeout_s=2, retry={"total_s": 2})
    np.testing.assert_allclose(model({"input__0": rows})["output__0"][:, 1], _xgboost(1, rows),
                               atol=1e-6)
    monkeypatch.delenv("COFFEA_SONIC_FALLBACK_REPOSITORY")
    with pytest.raises(ConfigurationError, match="neither a zoo model nor a FIL model"):
        fallback_engine("ttbar_bdt")
