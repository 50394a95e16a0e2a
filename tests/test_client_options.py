"""What a newcomer's first ``TritonModel`` gets: misspelt keywords named, NaN/inf warned about once,
the connect timeout and the NaN policy read from the settings like every other option."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic import validation
from coffea_sonic.errors import ConfigurationError, InputValidationError
from coffea_sonic.server import LocalTritonServer
from helpers import assert_sent_over


@pytest.fixture(autouse=True)
def _nothing_warned_yet():
    validation._warned_nonfinite.clear()
    yield
    validation._warned_nonfinite.clear()


@pytest.mark.parametrize("keyword, closest", [("timeout", "timeout_s"),
                                              ("connect_timeout", "connect_timeout_s"),
                                              ("fallbacks", "fallback")])
def test_an_unknown_keyword_names_the_closest_real_one(keyword: str, closest: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger", **{keyword: 5})
    assert f"unknown keyword {keyword!r}" in str(raised.value)
    assert f"did you mean {closest!r}" in str(raised.value)
    assert isinstance(raised.value, ValueError)  # callers catching bad arguments still do


def test_connect_timeout_and_nonfinite_come_from_the_settings(monkeypatch) -> None:
    url = "triton+grpc://127.0.0.1:8001/jet_tagger"
    assert TritonModel(url).connect_timeout_s == 10.0 and TritonModel(url).nonfinite == "warn"
    monkeypatch.setenv("COFFEA_SONIC_CONNECT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("COFFEA_SONIC_NONFINITE", "raise")
    model = TritonModel(url)
    assert (model.connect_timeout_s, model.nonfinite) == (2.5, "raise")
    assert TritonModel(url, connect_timeout_s=4, nonfinite="pass").connect_timeout_s == 4.0
    monkeypatch.setenv("COFFEA_SONIC_CONNECT_TIMEOUT_S", "soon")
    with pytest.raises(ConfigurationError, match="connect_timeout_s must be > 0"):
        TritonModel(url)
    with pytest.raises(ConfigurationError, match="'pass', 'warn', 'raise'"):
        TritonModel(url, connect_timeout_s=1, nonfinite="ignore")


def _with_nan(rows: int = 40) -> dict[str, np.ndarray]:
    features = np.random.default_rng(4).normal(size=(rows, 6)).astype(np.float32)
    features[3, 2] = np.nan
    features[7, 0] = np.inf
    return {"features": features}


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_nan_inputs_are_served_and_warned_about_once_per_model_and_tensor(
        transport: str, jet_tagger_server: LocalTritonServer, caplog) -> None:
    model = TritonModel(jet_tagger_server.url("jet_tagger"), transport=transport)
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        first = assert_sent_over(transport, jet_tagger_server.grpc_address,
                                 lambda: model(_with_nan()))
        model(_with_nan())
    assert first["probs"].shape == (40, 3)
    warnings = [r for r in caplog.records if r.name == "coffea_sonic.validation"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "'jet_tagger'" in message and "'features'" in message and "2 NaN/inf" in message
    assert "nonfinite='raise'" in message


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_nan_inputs_are_refused_with_raise_and_not_looked_at_with_pass(
        transport: str, jet_tagger_server: LocalTritonServer, caplog) -> None:
    strict = TritonModel(jet_tagger_server.url("jet_tagger"), transport=transport,
                         nonfinite="raise")
    with pytest.raises(InputValidationError, match="2 NaN/inf values"):
        strict(_with_nan())
    quiet = TritonModel(jet_tagger_server.url("jet_tagger"), transport=transport,
                        nonfinite="pass")
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.validation"):
        assert quiet(_with_nan())["probs"].shape == (40, 3)
    assert not [r for r in caplog.records if r.name == "coffea_sonic.validation"]
