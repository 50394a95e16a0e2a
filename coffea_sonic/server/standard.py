"""Which models of a repository written for NVIDIA's official Triton container the embedded server
can serve, and why not the others: :func:`plan_repository`, before anything starts.

How it works: docs/internals/standard-repositories.md (with an example).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from pathlib import Path
from typing import NamedTuple, Sequence

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..errors import require
from . import model_signatures as signatures
from .agents import agent_problems, strip_agents, verified_files

logger = logging.getLogger(__name__)

#: platform -> backend, as Triton normalises them.
PLATFORM_BACKENDS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch", "tensorrt_plan": "tensorrt",
    "tensorflow_graphdef": "tensorflow", "tensorflow_savedmodel": "tensorflow",
    "ensemble": "ensemble"}
#: Backends the python-based adapters run, and the framework each one loads.
ADAPTED: dict[str, str] = {"onnxruntime": "onnx", "pytorch": "torchscript", "fil": "trees"}
#: Backends served as they are.
AS_IS: tuple[str, ...] = ("python", "ensemble")
#: File of one version that each platform loads unless ``default_model_filename`` says otherwise;
#: also what Triton's auto-complete looks for to pick a backend (in this order).
DEFAULT_FILENAMES: dict[str, str] = {
    "tensorrt_plan": "model.plan", "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt", "tensorflow_graphdef": "model.graphdef",
    "tensorflow_savedmodel": "model.savedmodel", "python": "model.py"}
#: Triton's ``default-max-batch-size`` (auto-completed ONNX models with a dynamic batch axis).
DEFAULT_MAX_BATCH_SIZE = 4
_WHY_NOT: dict[str, str] = {
    "tensorrt": "TensorRT plans run only in NVIDIA's tensorrt backend, on the GPU model they were "
                "built for; the embedded server has no tensorrt backend",
    "tensorflow": "TensorFlow models need Triton's tensorflow backend, which the embedded server "
                  "does not have (export the model to ONNX, e.g. with tf2onnx, to serve it here)",
}
class Refusal(NamedTuple):
    """A model (``version`` None: every version) the embedded server cannot serve, and why."""

    model: str
    version: int | None
    reason: str

    def describe(self) -> str:
        """One line: ``model 'x' version 2: reason``.

        >>> Refusal("x", 2, "platform tensorrt_plan: no tensorrt backend").describe()
        "model 'x' version 2: platform tensorrt_plan: no tensorrt backend"
        """
        where = "every version" if self.version is None else f"version {self.version}"
        return f"model {self.model!r} {where}: {self.reason}"


@dataclasses.dataclass
class ServedModel:
    """A model the embedded server will serve: its source, backend and the config it is served with.

    ``config`` is None where the model has no config.pbtxt and Triton completes it (python
    models); ``config_changed`` says whether ``config`` differs from the user's file (it is then
    written into the served repository, else the user's file is linked). ``versions`` are those
    the version policy selects and the server can load; ``notes`` say what was changed and why.
    """

    name: str
    source: Path
    backend: str
    platform: str
    versions: tuple[int, ...]
    config: model_config_pb2.ModelConfig | None
    config_changed: bool = False
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def adapted(self) -> bool:
        """Whether the python-based adapter runs it (ONNX, TorchScript)."""
        return self.backend in ADAPTED


def version_folders(model_dir: Path) -> list[int]:
    """The numeric version folders of ``model_dir``, ascending (what Triton counts as versions)."""
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())


def selected_versions(config: model_config_pb2.ModelConfig | None,
                      available: list[int]) -> tuple[list[int], list[int]]:
    """(versions the version_policy selects among ``available``, specific ones that are missing).

    >>> config = model_config_pb2.ModelConfig()
    >>> selected_versions(config, [1, 2, 3])
    ([3], [])
    >>> config.version_policy.specific.versions[:] = [1, 4]
    >>> selected_versions(config, [1, 2, 3])
    ([1], [4])
    """
    policy = config.version_policy.WhichOneof("policy_choice") if config is not None else None
    if policy == "all":
        return list(available), []
    if policy == "specific":
        wanted = sorted(set(config.version_policy.specific.versions))
        return ([v for v in wanted if v in available], [v for v in wanted if v not in available])
    count = max(1, config.version_policy.latest.num_versions) if policy == "latest" else 1
    return sorted(available)[-count:], []


def _backend_of(config: model_config_pb2.ModelConfig | None, model_dir: Path,
                versions: list[int]) -> tuple[str, str]:
    """(backend, platform) as Triton resolves them; from the files when the config names neither."""
    platform = config.platform if config is not None else ""
    backend = config.backend if config is not None else ""
    if platform and not backend:
        backend = PLATFORM_BACKENDS.get(platform, "")
    if backend and not platform:
        platform = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch",
                    "python": "python"}.get(backend, backend)
    if backend:
        return backend, platform
    for candidate, filename in DEFAULT_FILENAMES.items():
        if any((model_dir / str(v) / filename).exists() for v in versions):
            return PLATFORM_BACKENDS.get(candidate, candidate), candidate
    return "", ""


def _onnx_signature(config: model_config_pb2.ModelConfig, path: Path) -> list[str]:
    """Complete missing inputs / outputs / max_batch_size from the ONNX graph (Triton's rules)."""
    if path.is_dir():
        path = path / "model.onnx"
    found = dict(zip(("input", "output"), signatures.onnx_tensors(path)))
    shapes = {tensor.name: () if tensor.dims == (signatures.UNKNOWN_RANK,) else tensor.dims
              for tensors in found.values() for tensor in tensors}
    notes = []
    if not config.input and not config.output and config.max_batch_size == 0 and all(
            shape and shape[0] == -1 for shape in shapes.values()):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
        notes.append(f"max_batch_size {DEFAULT_MAX_BATCH_SIZE} from the graph's dynamic first axis "
                     "(Triton's default-max-batch-size)")
    skip = 1 if config.max_batch_size > 0 else 0
    for kind, tensors in found.items():
        target = getattr(config, kind)
        if target:
            continue
        for tensor in tensors:  # a type Triton has no name for is declared TYPE_INVALID
            signatures.config_tensor(target.add(), dataclasses.replace(
                tensor, dims=shapes[tensor.name][skip:],
                datatype="INVALID" if " " in tensor.datatype else tensor.datatype))
        notes.append(f"{kind}s {[t.name for t in tensors]} read from {path.name}")
    return notes


def _gpu_groups_to_cpu(config: model_config_pb2.ModelConfig) -> bool:
    changed = False
    for group in config.instance_group:
        if group.kind == group.KIND_GPU or (group.kind == group.KIND_AUTO and group.gpus):
            group.kind = group.KIND_CPU
            del group.gpus[:]
            changed = True
    return changed


def _version_problem(backend: str, platform: str, config: model_config_pb2.ModelConfig | None,
                     model_dir: Path, version: int, ops: Sequence[str] = ()) -> str | None:
    if backend == "fil":
        from .fil import fil_version_problem

        return fil_version_problem(config, model_dir, version)
    filename = (config.default_model_filename if config is not None else "") or \
        DEFAULT_FILENAMES.get(platform if backend != "python" else "python", "")
    if backend == "ensemble" or not filename:
        return None
    if not (model_dir / str(version) / filename).exists():
        return (f"{model_dir / str(version) / filename} does not exist (platform {platform} loads "
                f"{filename}{' as default_model_filename says' if config and config.default_model_filename else ''})")
    if backend == "pytorch":
        from .torch_ops import torchscript_problem

        return torchscript_problem(model_dir / str(version) / filename, config, ops)
    if backend == "onnxruntime" and config is not None and (config.input or config.output):
        # the official container's onnxruntime backend refuses a config that contradicts the
        # graph; the adapter would run it anyway, so refuse it here the same way
        onnx = require("onnx", f"checking the config of {model_dir.name} against its ONNX graph")
        path = model_dir / str(version) / filename
        if path.is_dir():
            path = path / "model.onnx"
        try:
            graph = onnx.load(str(path), load_external_data=False)
        except Exception as error:  # noqa: BLE001 - an unreadable file is the refusal
            return f"{path} is not a readable ONNX model: {type(error).__name__}: {error}"
        mismatches = signatures.compare_onnx(config, graph)
        if mismatches:
            return ("config.pbtxt contradicts the ONNX graph, which the official container "
                    "refuses too: " + "; ".join(m.describe() for m in mismatches)
                    + " (see `coffea-sonic models validate`)")
    return None


def _plan_model(model_dir: Path, device: str,
                ops: Sequence[str] = ()) -> tuple[ServedModel | None, list[Refusal]]:
    name = model_dir.name
    config, refusal = _read_config(model_dir)
    if refusal:
        return None, refusal
    available = version_folders(model_dir)
    backend, platform = _backend_of(config, model_dir, available)
    label = f"platform {platform or backend or 'unknown'}"
    why_not = _backend_refusal(config, backend, label)
    if why_not:
        return None, [Refusal(name, None, why_not)]
    selected, missing = selected_versions(config, available)
    refusals = [Refusal(name, v, f"{label}: version_policy asks for version {v}, which has no "
                                 "folder") for v in missing]
    if not selected and not missing:
        refusals.append(Refusal(name, None, f"{label}: no version folder (1/, 2/, ...) "
                                            f"{'selected by version_policy' if available else ''}"
                                            .rstrip()))
    served = []
    for version in selected:
        problem = _version_problem(backend, platform, config, model_dir, version, ops)
        if problem is None:
            served.append(version)
        else:
            refusals.append(Refusal(name, version, f"{label}: {problem}"))
    if not served:
        return None, refusals
    if config is None and backend == "python":
        return ServedModel(name, model_dir, backend, platform, tuple(served), None), refusals
    notes: list[str] = []
    served_config = _served_config(model_dir, config, backend, platform, served, device, ops,
                                   notes)
    if len(served) < len(selected) + len(missing):
        served_config.version_policy.specific.versions[:] = served
        notes.append(f"version_policy: only versions {served} (the others are refused)")
    return ServedModel(name, model_dir, backend, platform, tuple(served), served_config,
                       config_changed=config is None or served_config != config,
                       notes=notes), refusals


def _read_config(model_dir: Path) -> tuple[model_config_pb2.ModelConfig | None, list[Refusal]]:
    """The model's config.pbtxt (None without one), or why the model is refused."""
    name = model_dir.name
    config_path = model_dir / "config.pbtxt"
    if not config_path.exists():
        return None, []
    try:
        config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    except (text_format.ParseError, UnicodeDecodeError) as error:
        return None, [Refusal(name, None, f"{config_path} is not a valid Triton model config: "
                                          f"{error}")]
    if config.name and config.name != name:
        return None, [Refusal(name, None, f"config.pbtxt names the model {config.name!r} but "
                                          f"its folder is {name!r}; Triton needs them equal")]
    agents = agent_problems(model_dir, config)
    if agents:
        return None, [Refusal(name, None, problem.describe()) for problem in agents]
    return config, []


def _backend_refusal(config: model_config_pb2.ModelConfig | None, backend: str,
                     label: str) -> str:
    """Why the embedded server cannot run a model of ``backend`` ("" if it can)."""
    if not backend:
        return ("no config.pbtxt and no model file Triton recognises "
                f"(one of {sorted(set(DEFAULT_FILENAMES.values()))})" if config is None
                else "config.pbtxt names neither platform nor backend, and no version folder "
                "holds a model file to tell it")
    if backend in _WHY_NOT:
        return f"{label}: {_WHY_NOT[backend]}"
    if backend not in ADAPTED and backend not in AS_IS:
        return (f"backend {backend!r} is a custom backend (libtriton_{backend}.so), which the "
                "embedded server does not have")
    if config is not None and config.runtime and config.runtime != f"libtriton_{backend}.so":
        return (f"{label}: runtime {config.runtime!r} (e.g. PyTorch 2's python-based backend) is "
                "not supported here")
    if config is None and backend in ("pytorch", "ensemble"):
        return (f"{label}: no config.pbtxt; Triton cannot complete a "
                f"{'TorchScript' if backend == 'pytorch' else 'ensemble'} config by itself: write "
                "one (`coffea-sonic models add`)")
    if backend == "pytorch" and importlib.util.find_spec("torch") is None:
        return (f"{label}: TorchScript needs torch in the server's Python and it is not "
                "importable: pip install 'coffea-sonic[torch]'")
    return ""


def _served_config(model_dir: Path, original: model_config_pb2.ModelConfig | None,
                   backend: str, platform: str, served: list[int], device: str,
                   ops: Sequence[str], notes: list[str]) -> model_config_pb2.ModelConfig:
    """The config the embedded server gets: completed and adapted (each change in ``notes``)."""
    config = model_config_pb2.ModelConfig() if original is None else _copy(original)
    if backend == "onnxruntime" and (not config.input or not config.output):
        if original is None:
            config.name, config.platform, config.backend = model_dir.name, platform, backend
        filename = config.default_model_filename or DEFAULT_FILENAMES["onnxruntime_onnx"]
        notes += _onnx_signature(config, model_dir / str(served[-1]) / filename)
    if backend == "fil":
        from .fil import fil_notes

        notes += fil_notes(config)
    if strip_agents(config):
        notes.append(f"model_repository_agents: {len(verified_files(original))} checksum(s) "
                     "verified before start; the served config leaves the block out (the embedded "
                     "server has no repository agents)")
    if backend == "pytorch" and ops:
        known = list(config.model_operations.op_library_filename)
        config.model_operations.op_library_filename.extend(
            str(Path(p).resolve()) for p in ops if str(Path(p).resolve()) not in known)
    if device == "cpu" and _gpu_groups_to_cpu(config):
        notes.append("instance_group KIND_GPU served as KIND_CPU (no GPU used: device cpu)")
    if device == "gpu" and backend == "onnxruntime" and not _onnxruntime_has_cuda() and (
            not config.instance_group or any(g.kind != g.KIND_CPU for g in config.instance_group)):
        notes.append("GPU instances run on the CPU: this onnxruntime has no CUDA execution "
                     "provider (onnxruntime-gpu)")
    accelerators = config.optimization.execution_accelerators
    if backend in ADAPTED and (accelerators.gpu_execution_accelerator
                               or accelerators.cpu_execution_accelerator):
        notes.append("optimization.execution_accelerators (TensorRT / OpenVINO) are not used: the "
                     "model runs in plain onnxruntime / torch")
    return config


def _onnxruntime_has_cuda() -> bool:
    onnxruntime = require("onnxruntime", "serving an ONNX model on a GPU")

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def _copy(config: model_config_pb2.ModelConfig) -> model_config_pb2.ModelConfig:
    duplicate = model_config_pb2.ModelConfig()
    duplicate.CopyFrom(config)
    return duplicate


def _refuse_broken_ensembles(servable: list[ServedModel], refusals: list[Refusal]) -> None:
    """Ensembles with a step that is not served are refused too (until nothing changes)."""
    while True:
        names = {model.name for model in servable}
        broken = [(model, step.model_name) for model in servable if model.backend == "ensemble"
                  for step in model.config.ensemble_scheduling.step if step.model_name not in names]
        if not broken:
            return
        for model, step in broken:
            if model in servable:
                servable.remove(model)
                refusals.append(Refusal(model.name, None, f"platform ensemble: its step {step!r} "
                                                          "is not served (refused or missing)"))


def plan_repository(repository: str | os.PathLike, *, device: str = "cpu",
                    torch_ops_libraries: Sequence[str | os.PathLike] = ()
                    ) -> tuple[list[ServedModel], list[Refusal]]:
    """(models the embedded server serves, refusals) for a Triton model repository.

    Reads every model folder (hidden folders are left out) and reads nothing else; writes nothing.
    ``device``: ``"cpu"`` serves KIND_GPU instance groups on the CPU, ``"gpu"`` keeps them.
    ``torch_ops_libraries``: operator libraries TorchScript models may need (:mod:`.torch_ops`).
    A model with some refused versions is servable with the others (the refusals name those).

    >>> import tempfile, pathlib
    >>> repo = pathlib.Path(tempfile.mkdtemp())
    >>> (repo / "echo" / "1").mkdir(parents=True)
    >>> _ = (repo / "echo" / "config.pbtxt").write_text('backend: "python"')
    >>> _ = (repo / "echo" / "1" / "model.py").write_text("")
    >>> [(m.name, m.backend, m.versions) for m in plan_repository(repo)[0]]
    [('echo', 'python', (1,))]
    """
    root = Path(repository)
    if not root.is_dir():
        from ..errors import ConfigurationError

        raise ConfigurationError(f"model repository {root} is not a directory")
    servable: list[ServedModel] = []
    refusals: list[Refusal] = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if model_dir.name.startswith("."):
            logger.info("model repository %s: leaving out hidden folder %s", root, model_dir.name)
            continue
        served, refused = _plan_model(model_dir, device, [str(p) for p in torch_ops_libraries])
        refusals += refused
        if served is not None:
            servable.append(served)
    _refuse_broken_ensembles(servable, refusals)
    return servable, refusals
