"""``coffea-sonic models add``: put an ONNX, TorchScript or tree model file into a Triton model
repository.

How it works, with an example: docs/internals/standard-repositories.md; what each format gives:
docs/user/own_model.md, "models add".
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..core.tensors import TensorInfo, triton_dtype
from ..errors import ConfigurationError, require
from . import model_signatures as signatures
from .agents import checksum_config, file_digest
from .standard import DEFAULT_FILENAMES

logger = logging.getLogger(__name__)

#: ``max_batch_size`` written for an ONNX model whose tensors all have a dynamic first axis.
DEFAULT_MAX_BATCH_SIZE = 1024
ONNX_PLATFORM, TORCH_PLATFORM = "onnxruntime_onnx", "pytorch_libtorch"
TRITON_TYPES: tuple[str, ...] = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                                 "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
Device = Literal["cpu", "gpu"]


def parse_tensor_spec(text: str) -> TensorInfo:
    """``NAME:TYPE:DIMS`` (``features:FP32:6``, ``INPUT__0:FP32:-1,2,-1``) as a ``TensorInfo``.

    >>> parse_tensor_spec("x:TYPE_INT64:[1]").dims
    (1,)
    """
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise ConfigurationError(
            f"tensor {text!r} is not NAME:TYPE:DIMS; e.g. INPUT__0:FP32:6 or points:FP32:-1,2,-1")
    name, datatype, dims_text = parts
    datatype = datatype.upper().removeprefix("TYPE_").replace("STRING", "BYTES")
    if datatype not in TRITON_TYPES:
        raise ConfigurationError(f"tensor {text!r}: {parts[1]!r} is not a Triton type; one of "
                                 + ", ".join(TRITON_TYPES))
    try:
        dims = tuple(int(d) for d in dims_text.strip("[] ").replace(" ", "").split(","))
    except ValueError:
        raise ConfigurationError(f"tensor {text!r}: dims {dims_text!r} are not integers like "
                                 "6 or -1,2,-1 (-1 = any size)") from None
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigurationError(f"tensor {text!r}: every dim is >= 1, or -1 for any size")
    return TensorInfo(name, datatype, dims)


@dataclass
class AddedModel:
    """What :func:`add_model` wrote, and notes worth telling the user."""

    name: str
    version: int
    config_path: Path
    model_path: Path
    config: model_config_pb2.ModelConfig
    notes: list[str] = field(default_factory=list)


def _onnx_signature(path: Path, max_batch_size: int | None, inputs: Sequence[TensorInfo],
                    outputs: Sequence[TensorInfo], notes: list[str]
                    ) -> tuple[int, list[TensorInfo], list[TensorInfo]]:
    graph_inputs, graph_outputs = signatures.onnx_tensors(path)
    given = {t.name: t for t in (*inputs, *outputs)}
    known = {t.name for t in (*graph_inputs, *graph_outputs)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigurationError(
            f"{path} has no tensor named {', '.join(unknown)}; its inputs are "
            f"{[t.name for t in graph_inputs]}, its outputs {[t.name for t in graph_outputs]}")
    derived = [t for t in (*graph_inputs, *graph_outputs) if t.name not in given]
    shapeless = [t.name for t in derived if t.dims == (signatures.UNKNOWN_RANK,)]
    if shapeless:
        raise ConfigurationError(f"{path} records no shape for {', '.join(shapeless)}: pass "
                                 f"--input/--output NAME:TYPE:DIMS for {'them' if len(shapeless) > 1 else 'it'}")
    fixed = [f"'{t.name}' (first axis {t.dims[0] if t.dims else 'none: a scalar'})"
             for t in derived if not t.dims or t.dims[0] != -1]
    if max_batch_size is None:
        max_batch_size = 0 if fixed else DEFAULT_MAX_BATCH_SIZE
        notes.append(f"max_batch_size {max_batch_size}: " + (
            f"not batching, {', '.join(fixed)} has no dynamic first axis" if fixed else
            "every input and output has a dynamic first axis (the batch axis)"))
    elif max_batch_size > 0 and fixed:
        raise ConfigurationError(
            f"{path}: --max-batch-size {max_batch_size} needs a dynamic first (batch) axis on every "
            f"input and output, but {', '.join(fixed)} is fixed. Export with dynamic_axes="
            "{name: {0: 'batch'}} for each tensor, or pass --max-batch-size 0 (full shapes)")

    def config_dims(tensor: TensorInfo) -> TensorInfo:
        if tensor.name in given:
            return given[tensor.name]
        dims = tensor.dims[1:] if max_batch_size > 0 else (tensor.dims or (1,))
        if not dims:  # [batch] only: one value per row
            dims = (1,)
        return TensorInfo(tensor.name, tensor.datatype, tuple(dims))

    unsupported = [t.name for t in (*graph_inputs, *graph_outputs) if " " in t.datatype]
    if unsupported:
        raise ConfigurationError(f"{path}: tensors {unsupported} have a type Triton cannot serve")
    return (max_batch_size, [config_dims(t) for t in graph_inputs],
            [config_dims(t) for t in graph_outputs if t.name in given or not outputs])


def _load_example(path: Path) -> dict[str, np.ndarray]:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"example input {path} is not a .npz/.npy file: {error}") from error
    if isinstance(loaded, np.ndarray):
        return {"INPUT__0": loaded}
    with loaded:
        return {(f"INPUT__{i}" if key == f"arr_{i}" else key): loaded[key]
                for i, key in enumerate(loaded.files)}


def _torchscript_signature(path: Path, max_batch_size: int | None, inputs: Sequence[TensorInfo],
                           outputs: Sequence[TensorInfo], example: Path | None
                           ) -> tuple[int, list[TensorInfo], list[TensorInfo]]:
    if max_batch_size is None:
        raise ConfigurationError(
            f"{path} is TorchScript, which does not record whether its first axis is a batch axis: "
            "pass --max-batch-size N (N > 0: the first axis of every input and output is the "
            "batch axis, and DIMS leave it out) or --max-batch-size 0 (DIMS are full shapes)")
    if example is None:
        if not inputs or not outputs:
            raise ConfigurationError(
                f"{path} is TorchScript, which does not record its tensors: pass every input and "
                "output, e.g. --input INPUT__0:FP32:6 --output OUTPUT__0:FP32:3 (names: forward's "
                "argument names or <name>__<index>; DIMS without the batch axis when "
                "--max-batch-size > 0), or --example-input example.npz to trace them")
        return max_batch_size, list(inputs), list(outputs)
    arrays = _load_example(example)
    if inputs and len(inputs) != len(arrays):
        raise ConfigurationError(f"{example} holds {len(arrays)} arrays but {len(inputs)} --input "
                                 "were given: one array per input, in forward's order")
    names = [t.name for t in inputs] or list(arrays)
    rows = {len(a) if a.ndim else 0 for a in arrays.values()}
    if max_batch_size > 0 and (len(rows) != 1 or 0 in rows):
        raise ConfigurationError(f"{example}: with --max-batch-size > 0 every array's first axis is "
                                 f"the batch axis and must have one length (found {sorted(rows)})")
    module = signatures.load_torchscript(path)
    try:
        results = signatures.run_torchscript(module, list(arrays.values()))
    except Exception as error:  # noqa: BLE001 (what the module raises is the user's answer)
        raise ConfigurationError(f"running {path} on the arrays of {example} failed: "
                                 f"{signatures.error_summary(error)}") from error
    cut = 1 if max_batch_size > 0 else 0
    bad = [i for i, r in enumerate(results) if cut and (r.dim() == 0 or r.shape[0] != min(rows))]
    if bad:
        raise ConfigurationError(f"{path}: outputs {bad} do not keep the example's batch axis "
                                 f"({min(rows)} rows): pass --max-batch-size 0")
    traced_in = [TensorInfo(n, triton_dtype(a.dtype), tuple(a.shape[cut:]) or (1,))
                 for n, a in zip(names, arrays.values())]
    traced_out = [TensorInfo(f"OUTPUT__{i}", signatures.torch_triton_type(r),
                             tuple(r.shape[cut:]) or (1,)) for i, r in enumerate(results)]
    return max_batch_size, list(inputs) or traced_in, list(outputs) or traced_out


def build_config(name: str, platform: str, max_batch_size: int, inputs: Sequence[TensorInfo],
                 outputs: Sequence[TensorInfo], *, preferred_batch_sizes: Sequence[int] = (),
                 max_queue_delay_us: int | None = None, instances: int = 1,
                 device: Device = "cpu") -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` :func:`add_model` writes (dynamic batching when the model batches).

    >>> config = build_config("m", "pytorch_libtorch", 0, [parse_tensor_spec("INPUT__0:FP32:-1,2")],
    ...                       [parse_tensor_spec("OUTPUT__0:FP32:3")], device="gpu", instances=2)
    >>> config.HasField("dynamic_batching"), config.instance_group[0].count
    (False, 2)
    """
    if device not in ("cpu", "gpu"):
        raise ConfigurationError(f"device must be cpu or gpu, not {device!r}")
    if instances < 1:
        raise ConfigurationError(f"instances must be >= 1, not {instances}")
    bad = [size for size in preferred_batch_sizes if not 0 < size <= max_batch_size]
    if bad:
        raise ConfigurationError(
            f"preferred batch sizes {bad} must be between 1 and max_batch_size ({max_batch_size})"
            + ("; a model with max_batch_size 0 does not batch" if max_batch_size == 0 else ""))
    config = model_config_pb2.ModelConfig(name=name, platform=platform, max_batch_size=max_batch_size)
    for tensor in inputs:
        signatures.config_tensor(config.input.add(), tensor)
    for tensor in outputs:
        signatures.config_tensor(config.output.add(), tensor)
    if max_batch_size > 0:
        config.dynamic_batching.preferred_batch_size[:] = list(preferred_batch_sizes)
        if max_queue_delay_us is not None:
            config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_us
    group = config.instance_group.add(count=instances)
    group.kind = group.KIND_GPU if device == "gpu" else group.KIND_CPU
    return config


def _signature(config: model_config_pb2.ModelConfig) -> tuple:
    return (config.platform, config.max_batch_size,
            [(t.name, t.data_type, list(t.dims)) for t in config.input],
            [(t.name, t.data_type, list(t.dims)) for t in config.output])


def _copy_onnx(source: Path, target: Path) -> None:
    """Copy an ONNX file and the external-data files its initializers name."""
    onnx = require("onnx", f"copying {source} with its external data")
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    shutil.copyfile(source, target)
    model = onnx.load(str(source), load_external_data=False)
    for location in {ExternalDataInfo(t).location for t in model.graph.initializer
                     if uses_external_data(t)}:
        shutil.copyfile(source.parent / location, target.parent / location)


def _checked_config(source: Path, name: str, notes: list[str], *, max_batch_size: int | None,
                    inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
                    example_input: str | os.PathLike | None, **options: Any
                    ) -> tuple[model_config_pb2.ModelConfig, bool]:
    """The config of model file ``source`` (and whether it is ONNX), checked against the file;
    ``ConfigurationError`` lists every mismatch. ``options``: :func:`build_config`'s."""
    onnx_file = signatures.is_onnx(source)
    platform = ONNX_PLATFORM if onnx_file else TORCH_PLATFORM
    if onnx_file:
        if example_input is not None:
            notes.append("--example-input is not needed for ONNX (the graph has the shapes); ignored")
        max_batch_size, ins, outs = _onnx_signature(source, max_batch_size, inputs, outputs, notes)
    else:
        max_batch_size, ins, outs = _torchscript_signature(
            source, max_batch_size, inputs, outputs,
            Path(example_input) if example_input is not None else None)
    config = build_config(name, platform, max_batch_size, ins, outs, **options)
    if onnx_file:
        mismatches = signatures.compare_onnx(config, source)
    else:
        try:
            module = signatures.load_torchscript(source)
        except ImportError:
            module = None
            notes.append("torch is not installed: the TorchScript module was not checked against "
                         "the config (pip install 'coffea-sonic[torch]', then models validate)")
        mismatches = signatures.compare_torchscript(config, module) if module is not None else []
    if mismatches:
        raise ConfigurationError(f"{source} does not match the signature given or derived "
                                 "(expected: what the model needs):\n" + "\n".join(
                                     f"  {m.describe()}" for m in mismatches))
    return config, onnx_file


def _existing_config(config_path: Path, config: model_config_pb2.ModelConfig, source: Path,
                     notes: list[str]) -> model_config_pb2.ModelConfig:
    """The config already at ``config_path``, which every version shares: it must declare the
    signature of the new version's ``config``."""
    existing = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    if _signature(existing) != _signature(config):
        raise ConfigurationError(
            f"{config_path} declares another signature than {source}; every version shares "
            "one config: add it under another --name, or pass --force to rewrite the config")
    notes.append(f"kept the existing {config_path} (its settings apply to every version)")
    return existing


def _write_version(source: Path, version_dir: Path, model_path: Path, onnx_file: bool) -> None:
    """Copy the model file into a fresh ``version_dir``."""
    if version_dir.exists():
        shutil.rmtree(version_dir)
    version_dir.mkdir(parents=True)
    if onnx_file:
        _copy_onnx(source, model_path)
    else:
        shutil.copyfile(source, model_path)


def _config_of(source: Path, name: str, notes: list[str], *, max_batch_size: int | None,
               inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo],
               example_input: str | os.PathLike | None, instances: int, device: Device,
               **options: Any) -> tuple[model_config_pb2.ModelConfig, str, str]:
    """(config, platform or backend, model file name) for ``source``: a tree model's FIL config,
    else the ONNX / TorchScript config checked against the file."""
    from .fil import tree_config, tree_model_type

    tree_type = tree_model_type(source)
    if tree_type is None:
        config, onnx_file = _checked_config(
            source, name, notes, max_batch_size=max_batch_size, inputs=inputs, outputs=outputs,
            example_input=example_input, instances=instances, device=device, **options)
        platform = ONNX_PLATFORM if onnx_file else TORCH_PLATFORM
        return config, platform, DEFAULT_FILENAMES[platform]
    from ..engines.forest import MODEL_TYPES, ForestError

    if inputs or outputs or example_input is not None:
        notes.append("a tree model's tensors come from the model file: --input, --output and "
                     "--example-input are ignored")
    try:
        config = tree_config(source, name, notes, max_batch_size=max_batch_size,
                             instances=instances, device=device)
    except ForestError as error:
        raise ConfigurationError(str(error)) from None
    return config, "fil", MODEL_TYPES[tree_type]


def add_model(file: str | os.PathLike, name: str, repository: str | os.PathLike, *,
              max_batch_size: int | None = None, preferred_batch_sizes: Sequence[int] = (),
              max_queue_delay_us: int | None = None, instances: int = 1, device: Device = "cpu",
              inputs: Sequence[TensorInfo] = (), outputs: Sequence[TensorInfo] = (),
              version: int = 1, example_input: str | os.PathLike | None = None,
              force: bool = False, checksum: bool = False,
              response_cache: bool = False) -> AddedModel:
    """Write ``repository/name/config.pbtxt`` and ``repository/name/<version>/model.*`` for ``file``.

    ``inputs``/``outputs`` (``TensorInfo``, e.g. from :func:`parse_tensor_spec`) override what the
    ONNX graph says, or give a TorchScript module's tensors; ``example_input`` (``.npz`` of the
    forward arguments, or one ``.npy``) traces them instead. The written config is checked
    against the file (:mod:`~coffea_sonic.server.model_signatures`); on a mismatch nothing stays
    written and ``ConfigurationError`` lists every problem. ``checksum=True`` adds the version's
    files to a checksum repository agent block (:mod:`~coffea_sonic.server.agents`), which the
    official container verifies before loading, and so does ``coffea-sonic serve``.
    ``response_cache=True`` enables Triton's response cache for the model (in the config, so for
    every version; the server needs ``--response-cache SIZE``).
    """
    source, repository = Path(file), Path(repository)
    if not source.is_file():
        raise ConfigurationError(f"model file {source} does not exist")
    if not _MODEL_NAME.match(name):
        raise ConfigurationError(f"model name {name!r}: use letters, digits, '_', '-', '.' "
                                 "(it becomes a folder and the name in every URL)")
    if version < 1:
        raise ConfigurationError(f"version must be >= 1 (a folder name), not {version}")
    notes: list[str] = []
    config, platform, filename = _config_of(
        source, name, notes, max_batch_size=max_batch_size, inputs=inputs, outputs=outputs,
        example_input=example_input, preferred_batch_sizes=preferred_batch_sizes,
        max_queue_delay_us=max_queue_delay_us, instances=instances, device=device)
    onnx_file = platform == ONNX_PLATFORM
    folder = repository / name
    version_dir = folder / str(version)
    config_path, model_path = folder / "config.pbtxt", version_dir / filename
    if version_dir.exists() and not force:
        raise ConfigurationError(f"{version_dir} already exists: pass --version N for a new version "
                                 "of the model, or --force to replace this one")
    if config_path.exists() and not force:
        config = _existing_config(config_path, config, source, notes)
    _write_version(source, version_dir, model_path, onnx_file)
    if response_cache:
        config.response_cache.enable = True
    if checksum:
        digests = {f"{version}/{p.name}": file_digest(p) for p in sorted(version_dir.iterdir())}
        checksum_config(digests, config)
        notes.append(f"checksum agent: MD5 of {', '.join(digests)}")
    config_path.write_text(text_format.MessageToString(config))
    versions = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    if len(versions) > 1 and config.version_policy.WhichOneof("policy_choice") is None:
        notes.append(f"{name} has versions {versions}; Triton serves only the latest unless "
                     "config.pbtxt says version_policy: { all: {} }")
    logger.info("added %s version %d to %s (%s)", name, version, repository, platform)
    return AddedModel(name, version, config_path, model_path, config, notes)
