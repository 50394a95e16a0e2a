"""``coffea-sonic models validate``: every problem of a Triton model repository, in one run.

How it works: docs/internals/standard-repositories.md, "Adding and validating your own models"
(with an example).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from . import model_signatures as signatures
from .agents import agent_problems, verified_files
from .standard import DEFAULT_FILENAMES, PLATFORM_BACKENDS, selected_versions, version_folders

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class Problem:
    """One problem: which model (and version, if it is a version's), what, expected vs found."""

    model: str
    version: str | None
    what: str
    expected: str = ""
    actual: str = ""
    fix: str = ""

    def describe(self) -> str:
        """``model [version V]: what: expected X, found Y (fix)``."""
        where = self.model + (f" version {self.version}" if self.version else "")
        text = signatures.Mismatch(self.what, self.expected, self.actual, self.fix).describe()
        return f"{where}: {text}"


@dataclass
class Report:
    """What :func:`validate_repository` found: the models it checked, problems and notes."""

    repository: Path
    models: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _dims_problems(model: str, kind: str, tensor: Any) -> list[Problem]:
    problems = []
    if tensor.data_type == model_config_pb2.TYPE_INVALID:
        problems.append(Problem(model, None, f"{kind} '{tensor.name}' data_type", "a TYPE_* value",
                                "none", "e.g. data_type: TYPE_FP32"))
    if not tensor.dims and not tensor.HasField("reshape"):
        problems.append(Problem(model, None, f"{kind} '{tensor.name}' dims", "at least one dim",
                                "[]", "a scalar per row is dims: [1]"))
    bad = [d for d in tensor.dims if d == 0 or d < -1]
    if bad:
        problems.append(Problem(model, None, f"{kind} '{tensor.name}' dims",
                                "each >= 1, or -1 for any size", str(list(tensor.dims))))
    return problems


def _config_problems(model: str, config: Any, platform: str, names: set[str]) -> list[Problem]:
    """What Triton's config validation refuses, before it looks at any file."""
    problems: list[Problem] = []
    if config.name and config.name != model:
        problems.append(Problem(model, None, "name", f"'{model}' (the folder's name) or none",
                                f"'{config.name}'", "rename the folder or the name"))
    if not config.platform and not config.backend:
        problems.append(Problem(model, None, "platform/backend", "one of them", "neither",
                                'e.g. platform: "onnxruntime_onnx" or backend: "python"'))
    elif config.platform and config.platform not in PLATFORM_BACKENDS:
        problems.append(Problem(model, None, "platform", "one of " + ", ".join(PLATFORM_BACKENDS),
                                f"'{config.platform}'", "custom backends go in backend:"))
    elif config.platform and config.backend and PLATFORM_BACKENDS[config.platform] != config.backend:
        problems.append(Problem(model, None, "backend", f"'{PLATFORM_BACKENDS[config.platform]}' "
                                f"for platform '{config.platform}'", f"'{config.backend}'"))
    if config.max_batch_size < 0:
        problems.append(Problem(model, None, "max_batch_size", ">= 0", str(config.max_batch_size)))
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen = [t.name for t in tensors]
        for name in sorted({n for n in seen if seen.count(n) > 1 or not n}):
            problems.append(Problem(model, None, f"{kind} name '{name}'", "unique and not empty",
                                    f"{seen.count(name)} times"))
        for tensor in tensors:
            problems += _dims_problems(model, kind, tensor)
        if not tensors and platform not in ("onnxruntime_onnx", "tensorrt_plan", "ensemble",
                                            "tensorflow_savedmodel"):
            problems.append(Problem(model, None, f"{kind}s", f"declared {kind}s", "none",
                                    f"{platform or 'this backend'} cannot derive them"))
    if config.HasField("dynamic_batching"):
        bad = [s for s in config.dynamic_batching.preferred_batch_size
               if not 0 < s <= config.max_batch_size]
        if bad:
            problems.append(Problem(model, None, "dynamic_batching preferred_batch_size",
                                    f"each 1..max_batch_size ({config.max_batch_size})", str(bad)))
    if platform == "ensemble":
        for step in config.ensemble_scheduling.step:
            if step.model_name not in names:
                problems.append(Problem(model, None, f"ensemble step '{step.model_name}'",
                                        "a model of this repository", "no such model folder"))
    return problems


def served_versions(folder: Path, config: Any) -> tuple[list[str], list[str]]:
    """Version folders Triton loads under ``config``'s version_policy, and versions it names but lacks.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()); (folder / "1").mkdir(); (folder / "3").mkdir()
    >>> served_versions(folder, model_config_pb2.ModelConfig())
    (['3'], [])
    """
    served, missing = selected_versions(config, version_folders(folder))
    return [str(v) for v in served], [str(v) for v in missing]


def model_filename(config: Any) -> str | None:
    """The file a version folder must hold: ``default_model_filename``, else the platform's default.

    >>> model_filename(model_config_pb2.ModelConfig(backend="onnxruntime"))
    'model.onnx'
    """
    if config.default_model_filename:
        return config.default_model_filename
    if config.backend == "fil":
        from .fil import fil_filename

        return fil_filename(config)
    platform = config.platform or next(
        (p for p, backend in PLATFORM_BACKENDS.items() if backend == config.backend), config.backend)
    return DEFAULT_FILENAMES.get(platform)


def _file_problems(model: str, version: str, path: Path, config: Any, platform: str,
                   notes: list[str]) -> list[Problem]:
    """The declared signature against the model file of one version."""
    try:
        if platform in ("onnxruntime_onnx", "onnxruntime"):
            mismatches = signatures.compare_onnx(config, path) if config.input or config.output else []
        elif platform == "fil":
            from .fil import fil_version_problem

            problem = fil_version_problem(config, path.parent.parent, int(version))
            return [Problem(model, version, "FIL model", "", problem,
                            "the official container's FIL backend refuses it too")] if problem else []
        elif platform in ("pytorch_libtorch", "pytorch"):
            if importlib.util.find_spec("torch") is None:
                notes.append(f"{model} version {version}: torch is not installed, the TorchScript "
                             "file was not compared (pip install 'coffea-sonic[torch]')")
                return []
            mismatches = signatures.compare_torchscript(config, signatures.load_torchscript(path))
        else:
            return []
    except Exception as error:  # noqa: BLE001 (an unreadable file is this version's problem)
        return [Problem(model, version, "model file", "a readable model",
                        signatures.error_summary(error))]
    return [Problem(model, version, m.what, m.expected, m.actual, m.fix) for m in mismatches]


def _without_config(folder: Path, notes: list[str]) -> list[Problem]:
    """A model folder without config.pbtxt: fine where Triton completes one (ONNX, python)."""
    model = folder.name
    writes_one = (f"coffea-sonic models add FILE --name {model} -o {folder.parent} "
                  "writes one")
    config = model_config_pb2.ModelConfig()
    versions, _ = served_versions(folder, config)
    files = {p.name for v in versions for p in (folder / v).iterdir()}
    if "model.onnx" in files or "model.py" in files:
        notes.append(f"{model}: no config.pbtxt; Triton completes it from "
                     f"{'the ONNX graph' if 'model.onnx' in files else 'model.py'} "
                     f"(max_batch_size 4 for a dynamic batch axis); {writes_one}")
        if "model.onnx" not in files:
            return []
        return [p for v in versions if (folder / v / "model.onnx").exists()
                for p in _file_problems(model, v, folder / v / "model.onnx", config,
                                        "onnxruntime_onnx", notes)]
    return [Problem(model, None, "config.pbtxt", f"{model}/config.pbtxt",
                    "nothing" + (f" (versions hold {sorted(files)})" if files else ""),
                    ("TorchScript needs one; " if "model.pt" in files else "") + writes_one)]


def check_model(folder: Path, names: set[str], notes: list[str]) -> list[Problem]:
    """Every problem of one model folder (config, versions, files, signature)."""
    model = folder.name
    config_path = folder / "config.pbtxt"
    if not config_path.is_file():
        return _without_config(folder, notes)
    try:
        config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as error:
        return [Problem(model, None, "config.pbtxt", "Triton's ModelConfig text format",
                        str(error), "fix the text at the line:column given")]
    platform = config.platform or config.backend
    problems = _config_problems(model, config, platform, names)
    problems += [Problem(model, None, p.what, p.expected, p.actual, p.fix)
                 for p in agent_problems(folder, config, others=False)]
    if verified_files(config):
        notes.append(f"{model}: checksum agent lists {', '.join(verified_files(config))}")
    versions, missing = served_versions(folder, config)
    for version in missing:
        problems.append(Problem(model, version, "version folder", f"{model}/{version}/ "
                                "(named by version_policy)", "nothing"))
    if not versions and not missing:
        problems.append(Problem(model, None, "version folders", f"{model}/1/ (a number) holding "
                                "the model file", "none", f"mkdir {model}/1"))
    filename = model_filename(config)
    # a tensor the config cannot even declare has been reported; comparing it would repeat that
    tensors_broken = any(p.what.startswith(("input ", "output ")) for p in problems)
    for version in versions if platform != "ensemble" and filename else ():
        path = folder / version / filename
        if not path.exists():
            found = sorted(p.name for p in (folder / version).iterdir())
            problems.append(Problem(model, version, "model file", f"{version}/{filename}",
                                    "nothing" if not found else f"only {found}",
                                    "put the model file there, or set default_model_filename"))
        elif not tensors_broken:
            problems += _file_problems(model, version, path, config, platform, notes)
    return problems


def _embedded_refusals(directory: Path) -> tuple[list[Any], str | None]:
    """``plan_repository``'s refusals, or a note if this installation has no such check."""
    try:
        from .standard import plan_repository
    except ImportError as error:
        return [], f"the embedded server's check is not available here ({error})"
    try:
        _, refusals = plan_repository(directory)
    except Exception as error:  # noqa: BLE001 (a repository it cannot plan is reported, not raised)
        return [], f"the embedded server could not plan {directory}: {error}"
    return list(refusals), None


def _refusal_problem(refusal: Any) -> Problem:
    """A refusal of ``plan_repository`` (model, version, reason, ...) as a Problem."""
    if isinstance(refusal, (tuple, list)):
        model, version, reason = (list(refusal) + ["", "", ""])[:3]
        fix = ""
    else:
        model = getattr(refusal, "model", "?")
        version = getattr(refusal, "version", None)
        reason = getattr(refusal, "reason", None) or getattr(refusal, "why", "") or str(refusal)
        fix = getattr(refusal, "fix", "") or getattr(refusal, "what_to_do", "")
    return Problem(str(model), str(version) if version not in (None, "") else None,
                   "the embedded server (coffea-sonic serve) cannot run it", "", str(reason),
                   fix or "serve it with the official Triton container, or pass "
                   "--skip-unservable to serve the rest")


def validate_repository(directory: str | os.PathLike, *, embedded: bool = True) -> Report:
    """Check every model folder of ``directory``; ``embedded=False`` skips the embedded-server check."""
    directory = Path(directory)
    report = Report(directory)
    if not directory.is_dir():
        report.problems.append(Problem(str(directory), None, "repository", "a folder of model "
                                       "folders", "no such folder"))
        return report
    folders = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = {folder.name for folder in folders}
    for folder in folders:
        report.models.append(folder.name)
        report.problems += check_model(folder, names, report.notes)
    if not folders:
        report.problems.append(Problem(str(directory), None, "models", "at least one model folder",
                                       "none", "coffea-sonic models add FILE --name NAME "
                                       f"-o {directory}"))
    if embedded and folders:
        refusals, note = _embedded_refusals(directory)
        if note:
            report.notes.append(note)
        # a model without its config or file is refused for that reason, reported above
        reported = {p.model for p in report.problems
                    if p.what in ("config.pbtxt", "model file", "version folders", "version folder")}
        flagged = {p.model for p in report.problems}
        for refusal in refusals:
            problem = _refusal_problem(refusal)
            if problem.model in flagged and problem.model not in reported:
                report.notes.append(f"also: {problem.describe()}")
            elif problem.model not in flagged:
                report.problems.append(problem)
    logger.info("validated %s: %d models, %d problems", directory, len(report.models),
                len(report.problems))
    return report
