"""A server restarted on the address of one that died is used by the next call, on every wire."""

from __future__ import annotations

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.errors import ServerUnavailableError
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer
from helpers import assert_sent_over, reference_engine

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def engine():
    return reference_engine("jet_tagger", threads=1)


def _jet_server(**ports: int) -> LocalTritonServer:
    return LocalTritonServer(models=["jet_tagger"], device="cpu", **ports).start()


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_a_server_restarted_on_the_same_address_serves_the_next_model(
        engine, transport):
    # a gRPC channel refused by the old server fails calls from memory for up to 2 s: the new
    # model's discovery must not take that for "no server reachable"
    first = _jet_server()
    ports = {f"{kind}_port": port for kind, port in first.ports.items()}
    scheme, address = (("http", first.http_address) if transport == "http"
                       else ("grpc", first.grpc_address))
    url = f"triton+{scheme}://{address}/jet_tagger"
    options = {"transport": transport, "connect_timeout_s": 2, "fallback": "off"}
    jets = zoo.example_inputs("jet_tagger", 1500)
    restarted = None
    try:
        _assert_right(TritonModel(url, **options)(jets), engine)
        first.stop()
        with pytest.raises(ServerUnavailableError):
            TritonModel(url, **options, retry={"total_s": 1.0})(jets)
        restarted = _jet_server(**ports)
        # other settings: a router of its own, which discovers the server anew
        fresh = TritonModel(url, **{**options, "connect_timeout_s": 3})
        _assert_right(assert_sent_over(transport, restarted, lambda: fresh(jets)), engine)
    finally:
        first.stop()
        if restarted is not None:
            restarted.stop()


def _assert_right(outputs, engine) -> None:
    expected = engine(zoo.example_inputs("jet_tagger", 1500))["probs"]
    np.testing.assert_allclose(outputs["probs"], expected, atol=TOLERANCE, rtol=0)
