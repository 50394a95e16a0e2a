"""FP16, BF16 and string (BYTES) tensors of official-format models, served by the embedded server
(ONNX through onnxruntime, BF16 TorchScript through DLPack) and sent by TritonModel on each wire."""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from coffea_sonic import TritonModel  # noqa: E402
from coffea_sonic.server import LocalTritonServer  # noqa: E402
from experiment_repository import typed_repository  # noqa: E402
from server_side import sent_over  # noqa: E402


@pytest.fixture(scope="module")
def typed_server(tmp_path_factory):
    repository = typed_repository(tmp_path_factory.mktemp("typed") / "models")
    with LocalTritonServer(repository=repository, device="cpu").start() as server:
        yield server


def _call(server: LocalTritonServer, name: str, inputs: dict, transport: str,
          outputs_in_shm: bool = True) -> dict:
    """One call of model ``name``, checked from the server's side to travel over ``transport``."""
    model = TritonModel(server.url(name), fallback="off")
    try:
        with sent_over(transport, server, outputs_in_shm=outputs_in_shm):
            return model(inputs)
    finally:
        model.close()


def test_fp16_and_string_tensors_round_trip(typed_server, each_transport):
    rows = np.random.default_rng(1).normal(size=(300, 4))
    half = _call(typed_server, "half", {"x": rows.astype(np.float16)}, each_transport)["y"]
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, rows.astype(np.float16) * 2)
    words = np.array([[w.encode()] for w in ("b", "charm", "light", "", "τ")], dtype=object)
    # strings are of unknown size: their answer comes back in the message, even over shm
    text = _call(typed_server, "text", {"x": words}, each_transport, outputs_in_shm=False)["y"]
    assert [v[0] for v in text.tolist()] == [w[0] for w in words.tolist()]


def test_bf16_tensors_round_trip(typed_server, each_transport):
    rows = np.random.default_rng(1).normal(size=(300, 4))
    brain = _call(typed_server, "brain", {"INPUT__0": rows.astype(ml_dtypes.bfloat16)},
                  each_transport)["OUTPUT__0"]
    assert brain.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(brain.astype(np.float32),
                                  rows.astype(ml_dtypes.bfloat16).astype(np.float32) * 2)
