"""What a model file declares, and where a config.pbtxt disagrees with it (as Triton would judge).

How it works: docs/internals/standard-repositories.md, "Where a config disagrees with its model
file" (with an example).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.tensors import TensorInfo
from ..errors import ConfigurationError, require

logger = logging.getLogger(__name__)

#: ONNX element type name (``onnx.TensorProto.DataType``) -> Triton datatype.
_ONNX_TO_TRITON: dict[str, str] = {
    "FLOAT": "FP32", "DOUBLE": "FP64", "FLOAT16": "FP16", "BFLOAT16": "BF16", "BOOL": "BOOL",
    "INT8": "INT8", "INT16": "INT16", "INT32": "INT32", "INT64": "INT64", "UINT8": "UINT8",
    "UINT16": "UINT16", "UINT32": "UINT32", "UINT64": "UINT64", "STRING": "BYTES",
}
#: torch dtype name -> Triton datatype.
_TORCH_TO_TRITON: dict[str, str] = {
    "float32": "FP32", "float64": "FP64", "float16": "FP16", "bfloat16": "BF16", "bool": "BOOL",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "uint8": "UINT8",
}
_TRITON_TO_TORCH: dict[str, str] = {value: key for key, value in _TORCH_TO_TRITON.items()}
#: ``<name>__<index>``: the pytorch backend's positional naming convention.
INDEXED_NAME = re.compile(r"^(.*)__(\d+)$")
#: The dims :func:`onnx_tensors` gives a tensor whose graph records no shape.
UNKNOWN_RANK = -2


@dataclass(frozen=True)
class Mismatch:
    """One disagreement: ``what``, what the model file has (``expected``), what the config says."""

    what: str
    expected: str
    actual: str
    fix: str = ""

    def describe(self) -> str:
        """One line: ``what: expected X, found Y (fix)``.

        >>> Mismatch("input 'x' dims", "[6]", "[7]", "set dims: [6]").describe()
        "input 'x' dims: expected [6], found [7] (set dims: [6])"
        """
        text = f"{self.what}: expected {self.expected}, found {self.actual}" if self.expected \
            else f"{self.what}: {self.actual}"
        return text + (f" ({self.fix})" if self.fix else "")


def error_summary(error: BaseException) -> str:
    """The informative end of an exception message (TorchScript puts a traceback first)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:400]


def config_datatype(config_type: int) -> str:
    """Triton datatype name (``"FP32"``) of a ``model_config_pb2.DataType`` value.

    >>> from tritonclient.grpc import model_config_pb2
    >>> config_datatype(model_config_pb2.TYPE_STRING), config_datatype(model_config_pb2.TYPE_FP32)
    ('BYTES', 'FP32')
    """
    from tritonclient.grpc import model_config_pb2

    name = model_config_pb2.DataType.Name(config_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def config_tensor(target: Any, tensor: TensorInfo) -> None:
    """Fill a config input/output from ``tensor`` (BYTES is written as Triton's TYPE_STRING)."""
    from tritonclient.grpc import model_config_pb2

    target.name, target.dims[:] = tensor.name, list(tensor.dims)
    target.data_type = model_config_pb2.DataType.Value(
        "TYPE_STRING" if tensor.datatype == "BYTES" else f"TYPE_{tensor.datatype}")


def onnx_tensors(model: Any) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """Graph inputs (initializers aside) and outputs of an ONNX model, full shapes (-1 = dynamic).

    ``model`` is a path or a loaded ``onnx.ModelProto``. A scalar has ``dims == ()``; a tensor
    whose graph records no shape at all gets ``dims == (UNKNOWN_RANK,)``.
    """
    onnx = require("onnx", "reading an ONNX model's signature")

    if not isinstance(model, onnx.ModelProto):
        try:
            model = onnx.load(str(model), load_external_data=False)
        except Exception as error:  # noqa: BLE001 (protobuf raises several types)
            raise ConfigurationError(f"{model} is not an ONNX model onnx can read: {error}") from error
    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}

    def describe(value: Any) -> TensorInfo:
        tensor_type = value.type.tensor_type
        elem = onnx.TensorProto.DataType.Name(tensor_type.elem_type)
        datatype = _ONNX_TO_TRITON.get(elem, f"unsupported ONNX type {elem}")
        dims = tuple(dim.dim_value if dim.HasField("dim_value") else -1
                     for dim in tensor_type.shape.dim)
        if not tensor_type.HasField("shape"):
            dims = (UNKNOWN_RANK,)
        return TensorInfo(value.name, datatype, dims)

    inputs = [describe(value) for value in graph.input if value.name not in initializers]
    return inputs, [describe(value) for value in graph.output]


def config_full_dims(dims: Sequence[int], max_batch_size: int) -> list[int]:
    """The full shape of a config tensor: ``[-1] + dims`` when the model batches.

    >>> config_full_dims([6], 1024), config_full_dims([-1, 2, -1], 0)
    ([-1, 6], [-1, 2, -1])
    """
    return ([-1] if max_batch_size > 0 else []) + list(dims)


def _compare_dims(kind: str, name: str, model_shape: Sequence[int], dims: Sequence[int],
                  max_batch_size: int, exact: bool) -> list[Mismatch]:
    """The onnxruntime backend's dims rule (``CompareDimsSupported``)."""
    what = f"{kind} '{name}' dims"
    if tuple(model_shape) == (UNKNOWN_RANK,):
        return []  # the graph does not say; onnxruntime checks at run time
    if not model_shape:  # a scalar in the graph: the config may only say [1] (or [1, 1])
        if any(dim != 1 for dim in dims):
            return [Mismatch(what, "[1] (the graph has a scalar)", str(list(dims)))]
        return []
    if max_batch_size > 0 and model_shape[0] != -1:
        return [Mismatch(f"{kind} '{name}' batch axis",
                         "a dynamic first axis in the graph (max_batch_size > 0)",
                         f"fixed first axis {model_shape[0]} in the graph",
                         "export with a dynamic batch axis (torch.onnx.export(..., dynamic_axes="
                         f"{{'{name}': {{0: 'batch'}}}})), or set max_batch_size: 0 and give full shapes")]
    model_dims = list(model_shape[1:] if max_batch_size > 0 else model_shape)
    batch_note = " (without the batch axis, max_batch_size > 0)" if max_batch_size > 0 else ""
    if len(model_dims) != len(dims) or any(
            m != d and (exact or m != -1) for m, d in zip(model_dims, dims)):
        return [Mismatch(what, f"{model_dims}{batch_note}", str(list(dims)),
                         f"set dims: {model_dims} in config.pbtxt")]
    return []


def compare_onnx(config: Any, model: Any) -> list[Mismatch]:
    """Everything in ``config`` (a ``ModelConfig``) the onnxruntime backend would refuse for ``model``.

    >>> from onnx import TensorProto, helper
    >>> from tritonclient.grpc import model_config_pb2
    >>> graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    >>> config = model_config_pb2.ModelConfig(max_batch_size=8)
    >>> config.input.add(name="x", data_type=model_config_pb2.TYPE_FP32, dims=[5])
    name: "x"...
    >>> config.output.add(name="z", data_type=model_config_pb2.TYPE_FP32, dims=[4])
    name: "z"...
    >>> [m.what for m in compare_onnx(config, helper.make_model(graph))]
    ["input 'x' dims", "output 'z'"]
    """
    inputs, outputs = onnx_tensors(model)
    mismatches: list[Mismatch] = []
    sequence = config.HasField("sequence_batching")
    batch_inputs = {name for batch_input in config.batch_input for name in batch_input.target_name}
    batch_outputs = {name for batch_output in config.batch_output
                     for name in batch_output.target_name}
    declared_names = [t.name for t in config.input] + sorted(batch_inputs)
    if not sequence and config.input and len(declared_names) != len(inputs):
        mismatches.append(Mismatch(
            "number of inputs", f"{len(inputs)} ({', '.join(t.name for t in inputs)})",
            f"{len(declared_names)} ({', '.join(declared_names)})",
            "declare every graph input, each once (as an input or a batch_input)"))
    for kind, declared, found in (("input", config.input, inputs), ("output", config.output, outputs)):
        by_name = {tensor.name: tensor for tensor in found}
        for tensor in declared:
            graph_tensor = by_name.get(tensor.name)
            if graph_tensor is None:
                mismatches.append(Mismatch(
                    f"{kind} '{tensor.name}'", f"one of the graph's {kind}s {sorted(by_name)}",
                    "a name the graph does not have", "use the graph's tensor names"))
                continue
            datatype = config_datatype(tensor.data_type)
            if datatype != graph_tensor.datatype:
                mismatches.append(Mismatch(
                    f"{kind} '{tensor.name}' data_type", f"TYPE_{graph_tensor.datatype}".replace(
                        "TYPE_BYTES", "TYPE_STRING"), f"TYPE_{datatype}".replace(
                        "TYPE_BYTES", "TYPE_STRING")))
            dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
            if kind == "input" and tensor.allow_ragged_batch and config.max_batch_size > 0:
                mismatches += _ragged_dims(tensor.name, graph_tensor.dims)
            elif kind == "output" and tensor.name in batch_outputs:
                continue  # scattered by its source input's shape, the graph's is the whole batch's
            else:
                mismatches += _compare_dims(kind, tensor.name, graph_tensor.dims, dims,
                                            config.max_batch_size, exact=kind == "output")
    return mismatches


def _ragged_dims(name: str, model_shape: Sequence[int]) -> list[Mismatch]:
    """A ragged input (``allow_ragged_batch``) reaches the model as one 1-D tensor, no batch axis."""
    if tuple(model_shape) == (UNKNOWN_RANK,) or len(model_shape) == 1:
        return []
    return [Mismatch(f"input '{name}' dims", "a 1-D graph input (allow_ragged_batch: the requests' "
                     "values concatenated, no batch axis)", f"{list(model_shape)} in the graph",
                     "export the input as 1-D, or drop allow_ragged_batch")]


def load_torchscript(path: str | os.PathLike) -> Any:
    """``torch.jit.load`` on the CPU, with an error that says what to do if it is not TorchScript."""
    torch = require("torch", "reading a TorchScript file")
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates torch.jit, but TorchScript is what Triton's pytorch backend runs
            warnings.filterwarnings("ignore", r"`torch\.jit\.", DeprecationWarning)
            return torch.jit.load(str(path), map_location="cpu")
    except Exception as error:  # noqa: BLE001 (torch raises RuntimeError and others)
        from .torch_ops import OPTION, missing_operator_name

        operator = missing_operator_name(str(error))
        if operator is not None:
            raise ConfigurationError(
                f"{path} calls operator {operator}, which no loaded library registers: the server "
                f"needs the library that provides it, {OPTION}") from error
        raise ConfigurationError(
            f"{path} is not a TorchScript file torch.jit.load can read ({error}); the pytorch "
            "backend needs torch.jit.trace(model, example) or torch.jit.script(model), then "
            ".save(path) — not torch.save(model)") from error


def forward_arguments(module: Any) -> list[str]:
    """Names of a TorchScript module's ``forward`` arguments, ``self`` excluded."""
    return [argument.name for argument in module.forward.schema.arguments][1:]


def _required_arguments(module: Any) -> int:
    """How many of ``forward``'s arguments (``self`` excluded) have no default."""
    return sum(not argument.has_default_value() for argument in module.forward.schema.arguments[1:])


def _output_list(result: Any) -> list[Any] | None:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return list(result)
    return None


def run_torchscript(module: Any, arrays: Sequence[np.ndarray]) -> list[Any]:
    """Outputs of ``module(*arrays)`` as a list of tensors; ``ConfigurationError`` if it fails."""
    import torch

    with torch.no_grad():
        result = module(*(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
    outputs = _output_list(result)
    if outputs is None:
        raise ConfigurationError(
            f"the module returned {type(result).__name__}, not a tensor or a tuple of tensors; "
            "the pytorch backend needs tensors (return a tuple instead of a dict)")
    return outputs


def torch_triton_type(tensor: Any) -> str:
    """Triton datatype of a torch tensor (``"FP32"``)."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _TORCH_TO_TRITON:
        raise ConfigurationError(f"torch dtype {name} has no Triton datatype")
    return _TORCH_TO_TRITON[name]


def _positions(names: Sequence[str]) -> list[int] | None:
    """Indices of ``<name>__<index>`` names if all follow the convention, else ``None``."""
    matches = [INDEXED_NAME.match(name) for name in names]
    if not names or not all(matches):
        return None
    return [int(match.group(2)) for match in matches]


def compare_torchscript(config: Any, module: Any) -> list[Mismatch]:
    """What in ``config`` the pytorch backend would refuse, or get wrong, for TorchScript ``module``.

    Names are checked by convention; when every non-batch input dim is known the module runs once
    on zeros (batch 1) and each declared output's shape and type is compared.
    """
    mismatches: list[Mismatch] = []
    arguments = forward_arguments(module)
    names = [tensor.name for tensor in config.input]
    positions = _positions(names)
    required = _required_arguments(module)
    if not required <= len(names) <= len(arguments):
        mismatches.append(Mismatch(
            "number of inputs", f"{required}" + (f" to {len(arguments)}" if required < len(
                arguments) else "") + f" (forward{tuple(arguments)})", str(len(names)),
            "declare one input per forward argument"))
    if positions is not None:
        bad = sorted({p for p in positions if p >= len(arguments)} |
                     {p for p in positions if positions.count(p) > 1})
        if bad:
            mismatches.append(Mismatch(
                "input indices", f"each of 0..{len(arguments) - 1} once (forward{tuple(arguments)})",
                str(positions), "name inputs INPUT__0, INPUT__1, ... in forward's order"))
    outputs = list(config.output)
    if not outputs:
        mismatches.append(Mismatch("outputs", "at least one output", "none",
                                   "declare outputs, e.g. OUTPUT__0"))
    full = [config_full_dims(t.dims, config.max_batch_size) for t in config.input]
    if mismatches or any(-1 in dims[1 if config.max_batch_size > 0 else 0:] for dims in full):
        return mismatches  # shapes not fully known: nothing to run
    import torch

    order = positions if positions is not None else (
        [arguments.index(n) for n in names] if set(names) <= set(arguments) else range(len(names)))
    arrays: dict[int, np.ndarray] = {}
    for slot, tensor, dims in zip(order, config.input, full):
        torch_type = getattr(torch, _TRITON_TO_TORCH.get(config_datatype(tensor.data_type), "float32"))
        arrays[slot] = torch.zeros([1 if d == -1 else d for d in dims], dtype=torch_type).numpy()
    if sorted(arrays) != list(range(len(arrays))):
        return mismatches  # inputs skip a forward argument that has a default: cannot call it
    try:
        results = run_torchscript(module, [arrays[slot] for slot in range(len(arrays))])
    except Exception as error:  # noqa: BLE001 (whatever the module raises is the finding)
        return [Mismatch("running the module on zeros of the declared input shapes failed", "",
                         error_summary(error), "check the inputs' dims, types and order")]
    return mismatches + _output_mismatches(config, outputs, results)


def _output_mismatches(config: Any, outputs: list, results: list) -> list[Mismatch]:
    """The declared ``outputs`` against what a run of the module returned (``results``)."""
    mismatches: list[Mismatch] = []
    out_positions = _positions([t.name for t in outputs]) or list(range(len(outputs)))
    for index, tensor in zip(out_positions, outputs):
        if index >= len(results):
            mismatches.append(Mismatch(f"output '{tensor.name}'", f"index < {len(results)} "
                                       f"(the module returns {len(results)} tensors)", str(index)))
            continue
        got, want = list(results[index].shape), config_full_dims(tensor.dims, config.max_batch_size)
        if len(got) != len(want) or any(w not in (-1, g) for w, g in zip(want, got)):
            shown = got[1:] if config.max_batch_size > 0 else got
            mismatches.append(Mismatch(f"output '{tensor.name}' dims", f"{shown} (from a run)",
                                       str(list(tensor.dims)), f"set dims: {shown}"))
        datatype, declared = torch_triton_type(results[index]), config_datatype(tensor.data_type)
        if datatype != declared:
            mismatches.append(Mismatch(f"output '{tensor.name}' data_type", f"TYPE_{datatype}",
                                       f"TYPE_{declared}"))
    return mismatches


def is_onnx(path: str | os.PathLike) -> bool:
    """Whether ``path`` looks like an ONNX file (by suffix, else by content)."""
    path = Path(path)
    if path.suffix.lower() == ".onnx":
        return True
    if path.suffix.lower() in (".pt", ".pth", ".ts", ".torchscript", ".jit"):
        return False
    import zipfile

    return not zipfile.is_zipfile(path)  # TorchScript files are zip archives
