"""Write standard Triton model repositories (config.pbtxt + version folder) for the zoo models.

The variants and the tuning knobs of :func:`model_config`: docs/internals/repositories.md (with
examples).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Iterable, Literal, Mapping

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from .. import zoo
from ..core.tensors import TensorInfo
from ..errors import ConfigurationError, require
from .model_signatures import config_tensor

logger = logging.getLogger(__name__)

Backend = Literal["python", "onnxruntime"]
Device = Literal["cpu", "gpu"]
BACKENDS: tuple[str, ...] = ("python", "onnxruntime")
DEVICES: tuple[str, ...] = ("cpu", "gpu")
Staging = Literal["pinned", "pageable"]
STAGINGS: tuple[str, ...] = ("pinned", "pageable")
#: Threads per GPU model instance that copy a large host input into pinned memory (model.py.tmpl).
GPU_COPY_THREADS = 4


@dataclass(frozen=True)
class QueuePolicy:
    """One queue policy of Triton's dynamic batcher (``ModelQueuePolicy``), for all requests or
    for one priority level.

    ``max_queue_size``: requests waiting at most (0: unbounded); a request beyond it is rejected at
    once ("Exceeds maximum queue size", which the client treats as overload: it halves its window
    and retries after a backoff). ``timeout_us``: how long a request may wait in the queue (0:
    forever); then ``timeout_action`` ``"REJECT"`` fails it or ``"DELAY"`` moves it behind the
    others. ``allow_timeout_override``: whether a request's own timeout may shorten it.

    >>> policy = QueuePolicy(max_queue_size=8).message()
    >>> policy.max_queue_size, model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action)
    (8, 'REJECT')
    """

    max_queue_size: int = 0
    timeout_us: int = 0
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    allow_timeout_override: bool = False

    def message(self) -> model_config_pb2.ModelQueuePolicy:
        """The ``ModelQueuePolicy`` message of this policy."""
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise ConfigurationError(
                f"timeout_action must be 'REJECT' or 'DELAY', not {self.timeout_action!r}")
        if self.max_queue_size < 0 or self.timeout_us < 0:
            raise ConfigurationError(f"queue sizes and timeouts must be >= 0: {self!r}")
        return model_config_pb2.ModelQueuePolicy(
            max_queue_size=self.max_queue_size, default_timeout_microseconds=self.timeout_us,
            timeout_action=model_config_pb2.ModelQueuePolicy.TimeoutAction.Value(self.timeout_action),
            allow_timeout_override=self.allow_timeout_override)


def model_config(
    name: str, *, backend: Backend = "python", device: Device = "cpu", instances: int = 1,
    max_queue_delay_microseconds: int | None = None,
    preferred_batch_sizes: Iterable[int] | None = None, max_queue_size: int | None = None,
    intra_op_threads: int = 0, tensorrt: bool = False, staging: Staging = "pinned",
    gpu_input_tensors: bool | None = None, torchscript_optimize: bool = False,
    copy_threads: int | None = None, priority_levels: int = 0,
    default_priority_level: int | None = None,
    queue_policies: Mapping[int, QueuePolicy] | None = None,
    rate_limiter_resources: Mapping[str, int] | None = None, response_cache: bool = False,
) -> model_config_pb2.ModelConfig:
    """The Triton ``ModelConfig`` of zoo model ``name`` for one backend and device (the tuning
    knobs: docs/internals/repositories.md).

    >>> config = model_config("emtrk_cnn", backend="onnxruntime", device="gpu")
    >>> config.platform, config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    ('onnxruntime_onnx', True)
    >>> gpu = model_config("emtrk_cnn", device="gpu", instances=2, gpu_input_tensors=True)
    >>> gpu.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value, gpu.instance_group[0].count
    ('no', 2)
    """
    for option, value, choices in (("staging", staging, STAGINGS), ("backend", backend, BACKENDS),
                                   ("device", device, DEVICES)):
        if value not in choices:
            raise ConfigurationError(f"{option} must be one of {choices}, not {value!r}")
    model_spec = zoo.spec(name)
    config = model_config_pb2.ModelConfig(name=name, max_batch_size=model_spec.max_batch_size)
    _backend_settings(config, backend, device, intra_op_threads=intra_op_threads,
                      staging=staging, torchscript_optimize=torchscript_optimize,
                      copy_threads=copy_threads, gpu_input_tensors=gpu_input_tensors,
                      tensorrt=tensorrt)
    for tensors, targets in ((model_spec.inputs, config.input), (model_spec.outputs, config.output)):
        for tensor in tensors:
            config_tensor(targets.add(), tensor.info)
    batching = config.dynamic_batching
    batching.preferred_batch_size[:] = list(preferred_batch_sizes or model_spec.preferred_batch_sizes)
    batching.max_queue_delay_microseconds = (
        model_spec.max_queue_delay_microseconds if max_queue_delay_microseconds is None
        else max_queue_delay_microseconds)
    if max_queue_size is not None:
        batching.default_queue_policy.max_queue_size = max_queue_size
    _priorities(batching, priority_levels, default_priority_level, queue_policies or {})
    group = config.instance_group.add(count=instances)
    group.kind = group.KIND_GPU if device == "gpu" else group.KIND_CPU
    for resource, count in (rate_limiter_resources or {}).items():
        group.rate_limiter.resources.add(name=resource, count=int(count))
    if response_cache:
        config.response_cache.enable = True
    return config


def _backend_settings(config: model_config_pb2.ModelConfig, backend: Backend, device: Device, *,
                      intra_op_threads: int, staging: Staging, torchscript_optimize: bool,
                      copy_threads: int | None, gpu_input_tensors: bool | None,
                      tensorrt: bool) -> None:
    """The backend, platform and backend parameters of a zoo model's config."""
    if backend == "python":
        config.backend = "python"
        config.parameters["device"].string_value = device
        config.parameters["intra_op_threads"].string_value = str(intra_op_threads)
        if device == "gpu":
            config.parameters["staging"].string_value = staging
            config.parameters["torchscript_optimize"].string_value = (
                "yes" if torchscript_optimize else "no")
            copy_threads = GPU_COPY_THREADS if copy_threads is None else copy_threads
            if not isinstance(copy_threads, int) or copy_threads < 1:
                raise ConfigurationError(f"copy_threads must be an int >= 1, not {copy_threads!r}")
            config.parameters["copy_threads"].string_value = str(copy_threads)
            if gpu_input_tensors is None or gpu_input_tensors:
                config.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value = "no"
    else:
        config.platform = "onnxruntime_onnx"
        if device == "gpu" and tensorrt:
            accelerator = config.optimization.execution_accelerators.gpu_execution_accelerator.add()
            accelerator.name = "tensorrt"
            accelerator.parameters["precision_mode"] = "FP32"


def _priorities(batching: model_config_pb2.ModelDynamicBatching, levels: int,
                default_level: int | None, policies: Mapping[int, QueuePolicy]) -> None:
    """Fill the batcher's priority levels and per-level queue policies (checked here: Triton
    would refuse to load the model with a message about the whole config)."""
    if not isinstance(levels, int) or levels < 0:
        raise ConfigurationError(f"priority_levels must be an int >= 0, not {levels!r}")
    if not levels:
        if default_level is not None or policies:
            raise ConfigurationError("default_priority_level and queue_policies need "
                                     "priority_levels >= 1")
        return
    default_level = levels if default_level is None else default_level
    if not 1 <= default_level <= levels:
        raise ConfigurationError(f"default_priority_level must be in 1..{levels}, not "
                                 f"{default_level!r}")
    batching.priority_levels = levels
    batching.default_priority_level = default_level
    for level, policy in policies.items():
        if not 1 <= int(level) <= levels:
            raise ConfigurationError(f"a queue policy for priority {level} but the levels are "
                                     f"1..{levels}")
        batching.priority_queue_policy[int(level)].CopyFrom(policy.message())


def config_text(config: model_config_pb2.ModelConfig) -> str:
    """config.pbtxt text of a ``ModelConfig`` (parses back with ``text_format.Parse``)."""
    return text_format.MessageToString(config)


def parse_config(path: str | os.PathLike) -> model_config_pb2.ModelConfig:
    """Parse a config.pbtxt with tritonclient's schema; raises ``ConfigurationError`` if invalid.

    >>> import tempfile
    >>> repo = write_repository(tempfile.mkdtemp(), models=["jet_tagger"])
    >>> parse_config(repo / "jet_tagger" / "config.pbtxt").max_batch_size
    65536
    """
    try:
        return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as error:
        raise ConfigurationError(f"{path} is not a valid Triton model config: {error}") from error


def _export_torchscript(name: str, target: Path) -> None:
    """Trace zoo model ``name`` to TorchScript at ``target``, in full fp32 (TF32 off)."""
    torch = require("torch", f"serving {name} on a GPU (TorchScript export)")

    module = zoo.torch_module(name)
    example = tuple(torch.from_numpy(value) for value in zoo.example_inputs(name, 2).values())
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        with torch.no_grad():
            traced = torch.jit.trace(module, example, check_trace=False)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags
    traced.save(str(target))


def write_repository(
    dest: str | os.PathLike,
    models: Iterable[str] | None = None,
    *,
    backend: Backend = "python",
    device: Device = "cpu",
    instances: int = 1,
    link: bool = False,
    **config_options,
) -> Path:
    """Write a Triton model repository for zoo ``models`` (default: all) into ``dest``.

    ``link=True`` symlinks the ONNX files instead of copying them (fast, for the embedded server);
    leave it off for a repository you hand to a facility. Extra keyword arguments go to
    :func:`model_config` (``max_queue_delay_microseconds``, ``max_queue_size``, ...).

    >>> import tempfile
    >>> repo = write_repository(tempfile.mkdtemp(), ["jet_tagger"], backend="onnxruntime")
    >>> sorted(p.name for p in (repo / "jet_tagger" / "1").iterdir())
    ['model.onnx']
    """
    dest = Path(dest)
    names = list(models) if models is not None else zoo.names()
    if not names:
        raise ConfigurationError("no models to write; pick some of " + ", ".join(zoo.names()))
    template = resources.files("coffea_sonic.server") / "model.py.tmpl"
    for name in names:
        config = model_config(name, backend=backend, device=device, instances=instances,
                              **config_options)
        files: dict[str, str | Path] = {}
        if backend == "onnxruntime" or device == "cpu":
            files["model.onnx"] = zoo.onnx_path(name)
        if backend == "python":
            files["model.py"] = template.read_text()
        folder = write_model(dest, config, files, link=link)
        if backend == "python" and device == "gpu":
            _export_torchscript(name, folder / "1" / "model.pt")
    return dest


def ragged_model_config(
    name: str,
    inputs: Sequence[TensorInfo],
    object_outputs: Sequence[TensorInfo] = (),
    event_outputs: Sequence[TensorInfo] = (),
    *,
    backend: str = "python",
    device: Device = "cpu",
    instances: int = 1,
    max_batch_size: int = 64,
    counts_of: str | None = None,
    index_input: str | None = None,
    max_queue_delay_microseconds: int = 0,
    parameters: Mapping[str, str] | None = None,
) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` of a ragged model (the convention of :mod:`coffea_sonic.ragged`).

    ``inputs``: the ragged inputs with their per-row dims (``TensorInfo("hits", "FP32", (3,))``
    is declared ``dims: [-1, 3]``, ``allow_ragged_batch: true``); the counts input
    ``<counts_of>__counts`` (default: the first input's) is added, INT64, ragged and optional.
    ``object_outputs``: one row per input row (per-row dims; declared ``[-1, ...]`` and listed in
    a ``BATCH_SCATTER_WITH_INPUT_SHAPE`` batch output); ``event_outputs``: one row per event.
    ``index_input``: also declare Triton's ``BATCH_ACCUMULATED_ELEMENT_COUNT`` batch input of
    that name (built by backends that build batch inputs, for one-event requests; the python
    backend never gets it). ``backend``: the Triton backend (python, onnxruntime, ...).

    >>> from coffea_sonic.core.tensors import TensorInfo
    >>> config = ragged_model_config("hitsum", [TensorInfo("hits", "FP32", (3,))],
    ...                              [TensorInfo("hit_sum", "FP32", ())],
    ...                              [TensorInfo("event_sum", "FP32", (1,))])
    >>> [(i.name, list(i.dims), i.allow_ragged_batch) for i in config.input]
    [('hits', [-1, 3], True), ('hits__counts', [-1], True)]
    >>> list(config.batch_output[0].target_name), list(config.batch_output[0].source_input)
    (['hit_sum'], ['hits'])
    """
    if not inputs:
        raise ConfigurationError(f"ragged model {name!r} needs at least one ragged input")
    if device not in DEVICES:
        raise ConfigurationError(f"device must be one of {DEVICES}, not {device!r}")
    if not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ConfigurationError(
            f"a ragged model batches requests: max_batch_size must be an int >= 1, not "
            f"{max_batch_size!r}")
    names = [t.name for t in inputs]
    source = counts_of if counts_of is not None else names[0]
    if source not in names:
        raise ConfigurationError(f"counts_of={counts_of!r} is not one of the inputs {names}")
    config = model_config_pb2.ModelConfig(name=name, max_batch_size=max_batch_size,
                                          backend=backend)
    if backend == "python":
        config.parameters["device"].string_value = device
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = str(value)
    _declare_ragged(config, source, inputs, object_outputs, event_outputs, index_input)
    config.dynamic_batching.max_queue_delay_microseconds = max_queue_delay_microseconds
    group = config.instance_group.add()
    group.count = instances
    group.kind = group.KIND_GPU if device == "gpu" else group.KIND_CPU
    return config


def _declare_ragged(config: model_config_pb2.ModelConfig, source: str,
                    inputs: Sequence[TensorInfo], object_outputs: Sequence[TensorInfo],
                    event_outputs: Sequence[TensorInfo], index_input: str | None) -> None:
    """The tensors of a ragged model: ragged inputs and their counts, outputs per object
    (scattered by ``source``'s shape) and per event, and the optional index batch input."""
    def declare(target, tensor: TensorInfo, dims: Sequence[int]) -> None:
        config_tensor(target, replace(tensor, dims=tuple(dims)))

    for tensor in inputs:
        entry = config.input.add()
        declare(entry, tensor, (-1, *tensor.dims))
        entry.allow_ragged_batch = True
    counts = config.input.add(name=f"{source}__counts", data_type=model_config_pb2.TYPE_INT64,
                              allow_ragged_batch=True, optional=True)
    counts.dims[:] = [-1]
    for tensor in object_outputs:
        declare(config.output.add(), tensor, (-1, *tensor.dims))
    for tensor in event_outputs:
        declare(config.output.add(), tensor, tensor.dims)
    if object_outputs:
        config.batch_output.add(
            target_name=[t.name for t in object_outputs], source_input=[source],
            kind=model_config_pb2.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE)
    if index_input:
        config.batch_input.add(
            kind=model_config_pb2.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT,
            target_name=[index_input], data_type=model_config_pb2.TYPE_INT32,
            source_input=[source])


def write_model(dest: str | os.PathLike, config: model_config_pb2.ModelConfig,
                files: Mapping[str, str | bytes | Path], version: int = 1, *,
                link: bool = False) -> Path:
    """Write one model (any config, e.g. :func:`ragged_model_config`) into repository ``dest``:
    ``dest/<name>/config.pbtxt`` and ``files`` in its version folder, the folder made anew: text
    or bytes written (``{"model.py": source}``), a ``Path`` copied (``link=True``: symlinked, fast
    for the embedded server; leave it off for a repository you hand to a facility).

    >>> import tempfile
    >>> from coffea_sonic.core.tensors import TensorInfo
    >>> config = ragged_model_config("hitsum", [TensorInfo("hits", "FP32", (3,))])
    >>> folder = write_model(tempfile.mkdtemp(), config, {"model.py": "# TritonPythonModel"})
    >>> sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    ['1/model.py', 'config.pbtxt']
    """
    folder = Path(dest) / config.name
    if folder.exists():
        shutil.rmtree(folder)
    version_dir = folder / str(version)
    version_dir.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config_text(config))
    for file_name, content in files.items():
        target = version_dir / file_name
        if isinstance(content, Path) and link:
            target.symlink_to(content.resolve())
        elif isinstance(content, Path):
            shutil.copyfile(content, target)
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    logger.info("wrote %s (%s)", folder, config.backend or config.platform)
    return folder
