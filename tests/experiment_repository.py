"""Repositories shaped like the ones experiments publish for NVIDIA's official Triton container.

Every config carries a checksum repository agent (MD5 of its model file), a label file, a graph
optimisation level and a ``max_batch_size`` between 160 and 500, as CMS's b-tagging repository
does: a ParticleNet-like ONNX model, the same network as TorchScript (``INPUT__0`` names) and an
ONNX mass regression. The models are built here with torch (ONNX export, TorchScript).
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import numpy as np
import torch

CHANNELS, PARTICLES = 4, 10
LABELS = ["b", "c", "light"]


class ParticleNetLite(torch.nn.Module):
    """points [N, 2, P], features [N, C, P] -> softmax [N, 3] (one score per label)."""

    def __init__(self) -> None:
        super().__init__()
        self.point = torch.nn.Conv1d(2 + CHANNELS, 8, 1)
        self.head = torch.nn.Linear(8, len(LABELS))

    def forward(self, points: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.point(torch.cat([points, features], 1)))
        return torch.softmax(self.head(x.mean(2)), dim=1)


class MassRegression(torch.nn.Module):
    """features [N, 6] -> mass [N, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.mlp(features)


def export_onnx(module: torch.nn.Module, example: tuple, path: Path, inputs: list[str],
                outputs: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # the TorchScript-based exporter is deprecated, not gone
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), example, str(path), dynamo=False, input_names=inputs,
                          output_names=outputs,
                          dynamic_axes={name: {0: "n"} for name in inputs + outputs})


def export_torchscript(module: torch.nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # torch.jit is deprecated, but it is what Triton serves
        warnings.simplefilter("ignore")
        torch.jit.script(module.eval()).save(str(path))


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _agent(relative: str, digest: str) -> str:
    return ('model_repository_agents { agents [ { name: "checksum" parameters { '
            f'key: "MD5:{relative}" value: "{digest}" }} }} ] }}\n')


PNET_ONNX = """name: "pnet_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 200
input [ { name: "pf_points" data_type: TYPE_FP32 dims: [ 2, %(P)d ] },
        { name: "pf_features" data_type: TYPE_FP32 dims: [ %(C)d, %(P)d ] } ]
output [ { name: "softmax" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
optimization { graph { level: -1 } }
dynamic_batching { }
instance_group [ { kind: KIND_GPU count: 1 } ]
""" % {"P": PARTICLES, "C": CHANNELS}
PNET_TS = """name: "pnet_ts"
platform: "pytorch_libtorch"
max_batch_size: 500
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2, %(P)d ] },
        { name: "INPUT__1" data_type: TYPE_FP32 dims: [ %(C)d, %(P)d ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
optimization { graph { level: 1 } }
dynamic_batching { }
instance_group [ { kind: KIND_CPU count: 1 } ]
""" % {"P": PARTICLES, "C": CHANNELS}
MASS = """name: "mass_reg"
platform: "onnxruntime_onnx"
max_batch_size: 160
input [ { name: "features" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "mass" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "labels.txt" } ]
optimization { graph { level: 0 } }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def experiment_repository(root: Path) -> Path:
    """Write the repository under ``root`` (three models, each with its checksum agent)."""
    torch.manual_seed(11)
    pnet = ParticleNetLite()
    example = (torch.zeros(2, 2, PARTICLES), torch.zeros(2, CHANNELS, PARTICLES))
    export_onnx(pnet, example, root / "pnet_onnx" / "1" / "model.onnx",
                ["pf_points", "pf_features"], ["softmax"])
    export_torchscript(pnet, root / "pnet_ts" / "1" / "model.pt")
    export_onnx(MassRegression(), (torch.zeros(2, 6),), root / "mass_reg" / "1" / "model.onnx",
                ["features"], ["mass"])
    for name, config, filename, labels in (("pnet_onnx", PNET_ONNX, "model.onnx", LABELS),
                                           ("pnet_ts", PNET_TS, "model.pt", LABELS),
                                           ("mass_reg", MASS, "model.onnx", ["mass"])):
        (root / name / "labels.txt").write_text("\n".join(labels) + "\n")
        relative = f"1/{filename}"
        (root / name / "config.pbtxt").write_text(config + _agent(relative, md5(root / name / relative)))
    return root


def particle_inputs(events: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"points": rng.normal(size=(events, 2, PARTICLES)).astype(np.float32),
            "features": rng.normal(size=(events, CHANNELS, PARTICLES)).astype(np.float32)}


RAGGED = """name: "ragged_io"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNT_IN" data_type: TYPE_FP32
                source_input: "INPUT0" },
              { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS"
                data_type: TYPE_INT32 source_input: "INPUT0" } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "COUNT" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_output [ { target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT0" } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def ragged_repository(root: Path) -> Path:
    """CMS's ragged test model's shape: a 1-D graph input (the concatenated ragged batch), config
    dims [-1], max_batch_size 4, allow_ragged_batch, batch inputs and a batch_output.

    OUTPUT0 = 2 * INPUT0 (scattered back per request); COUNT = each request's element count (from
    the BATCH_ELEMENT_COUNT batch input), one row per request; the offsets batch input is read by
    nothing but must be fed (a graph input).
    """
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "TWO"], ["OUTPUT0"]),
         helper.make_node("Unsqueeze", ["COUNT_IN", "AXIS"], ["COUNT"]),
         helper.make_node("Shape", ["OFFSETS"], ["OFFSETS_SHAPE"])],
        "ragged_io",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("COUNT_IN", TensorProto.FLOAT, ["r"]),
         helper.make_tensor_value_info("OFFSETS", TensorProto.INT32, ["r1"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("COUNT", TensorProto.FLOAT, ["r", 1])],
        [helper.make_tensor("TWO", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("AXIS", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / "ragged_io" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "ragged_io" / "1" / "model.onnx"))
    (root / "ragged_io" / "config.pbtxt").write_text(RAGGED)
    return root


def typed_repository(root: Path) -> Path:
    """FP16 and string (BYTES) ONNX models and a BF16 TorchScript model, official format."""
    import onnx
    from onnx import TensorProto, helper

    def onnx_model(name: str, node: str, elem: int, type_name: str, dims: int) -> None:
        graph = helper.make_graph(
            [helper.make_node(node, ["x", "x"] if node == "Add" else ["x"], ["y"])], name,
            [helper.make_tensor_value_info("x", elem, ["n", dims])],
            [helper.make_tensor_value_info("y", elem, ["n", dims])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
        (root / name / "config.pbtxt").write_text(
            f'platform: "onnxruntime_onnx"\nmax_batch_size: 256\n'
            f'input [{{ name: "x" data_type: {type_name} dims: [{dims}] }}]\n'
            f'output [{{ name: "y" data_type: {type_name} dims: [{dims}] }}]\n')

    onnx_model("half", "Add", TensorProto.FLOAT16, "TYPE_FP16", 4)
    onnx_model("text", "Identity", TensorProto.STRING, "TYPE_STRING", 1)

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    export_torchscript(Double(), root / "brain" / "1" / "model.pt")
    (root / "brain" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 256\n'
        'input [{ name: "INPUT__0" data_type: TYPE_BF16 dims: [4] }]\n'
        'output [{ name: "OUTPUT__0" data_type: TYPE_BF16 dims: [4] }]\n')
    return root
