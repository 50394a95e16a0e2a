"""TorchScript models that need a custom operator library, as torch_geometric's graph models need
torch_sparse's: refused before anything starts, naming the operator and ``--torch-ops-library``;
served with the library and answering like torch in-process.

The operator library is built here with g++ against torch's headers (one C++ file, about 6 s of
CPU, once per module); without a compiler the tests are skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coffea_sonic import TritonModel  # noqa: E402
from coffea_sonic.server import LocalTritonServer  # noqa: E402

OPERATOR = """#include <torch/library.h>
#include <ATen/ATen.h>

at::Tensor scale_shift(const at::Tensor& x, double factor) { return x * factor + 1.0; }

TORCH_LIBRARY(sonic_test, m) { m.def("scale_shift(Tensor x, float factor) -> Tensor", &scale_shift); }
"""
CONFIG = """platform: "pytorch_libtorch"
max_batch_size: 256
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def build_operator_library(folder: Path) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++) to build the operator library")
    root = Path(torch.__file__).parent
    source = folder / "sonic_test_ops.cpp"
    source.write_text(OPERATOR)
    library = folder / "libsonic_test_ops.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O0", "-std=c++20",
                    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                    str(source), f"-I{root / 'include'}",
                    f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
                    f"-L{root / 'lib'}", "-ltorch", "-ltorch_cpu", "-lc10",
                    f"-Wl,-rpath,{root / 'lib'}", "-o", str(library)],
                   check=True, capture_output=True, timeout=600)
    return library


class UsesOperator(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.sonic_test.scale_shift(torch.relu(x), 2.0)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ops")
    library = build_operator_library(folder)
    torch.ops.load_library(str(library))  # to script the module here
    model_dir = folder / "models" / "graph_net"
    (model_dir / "1").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(UsesOperator()).save(str(model_dir / "1" / "model.pt"))
    (model_dir / "config.pbtxt").write_text(CONFIG)
    return folder / "models", library


def test_serve_refuses_a_model_whose_operator_no_library_registers(repository):
    models, _ = repository
    done = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "serve", "--repository",
                           str(models), "--grpc-port", "0", "--http-port", "0",
                           "--metrics-port", "0", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 1, done.stdout + done.stderr
    for text in ("'graph_net'", "sonic_test::scale_shift", "--torch-ops-library PATH",
                 "LD_PRELOAD"):
        assert text in done.stderr, (text, done.stderr)
    assert "ready" not in done.stdout


def test_served_with_the_operator_library_answers_like_torch(repository):
    models, library = repository
    rows = np.random.default_rng(2).normal(size=(600, 4)).astype(np.float32)
    with LocalTritonServer(repository=models, device="cpu",
                           torch_ops_libraries=[library]).start() as server:
        model = TritonModel(server.url("graph_net"), fallback="off")
        try:
            answer = model({"INPUT__0": rows})["OUTPUT__0"]
        finally:
            model.close()
    np.testing.assert_allclose(answer, np.maximum(rows, 0) * 2 + 1, rtol=1e-6)
