"""The served copy of a user's Triton repository, and the python-based backends that run it.

How it works: docs/internals/standard-repositories.md, "The served copy and the adapters" (with
an example).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from importlib import resources
from pathlib import Path

from google.protobuf import text_format

from ..errors import UnservableModelError
from .standard import ADAPTED, Refusal, ServedModel, plan_repository

logger = logging.getLogger(__name__)

__all__ = ["PreparedRepository", "install_adapters", "prepare_repository", "refusal_message"]


@dataclasses.dataclass
class PreparedRepository:
    """What :func:`prepare_repository` built: the served repository and what it left out."""

    path: Path
    models: list[ServedModel]
    skipped: list[Refusal]

    @property
    def needs_adapters(self) -> bool:
        """Whether an ONNX or TorchScript model is served (the adapters must be installed)."""
        return any(model.adapted for model in self.models)


def refusal_message(repository: Path, refusals: list[Refusal]) -> str:
    """The error text: every refused model and version, why, and what to do.

    >>> print(refusal_message(Path("/r"), [Refusal("a", 1, "platform tensorrt_plan: no backend")]))
    the embedded Triton server cannot serve 1 model of /r:
      - model 'a' version 1: platform tensorrt_plan: no backend
    What to do: serve this repository with NVIDIA's official Triton container ...
    """
    models = sorted({r.model for r in refusals})
    lines = [f"the embedded Triton server cannot serve {len(models)} "
             f"model{'s' if len(models) != 1 else ''} of {repository}:"]
    lines += [f"  - {refusal.describe()}" for refusal in refusals]
    lines.append(
        "What to do: serve this repository with NVIDIA's official Triton container "
        "(nvcr.io/nvidia/tritonserver:<yy.mm>-py3), or export the model to ONNX or TorchScript; "
        f"check every model at once with `coffea-sonic models validate {repository}`; or serve "
        "the others: LocalTritonServer(repository=..., skip_unservable=True), "
        "`coffea-sonic serve --repository DIR --skip-unservable`.")
    return "\n".join(lines)


def _mirror(source: Path, target: Path, leave_out: set[str] = frozenset()) -> None:
    """``target``: folders made anew, every file a symlink to ``source``'s."""
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name in leave_out or entry.name == "__pycache__":
            continue
        if entry.is_dir():
            _mirror(entry, target / entry.name)
        else:
            (target / entry.name).symlink_to(entry.resolve())


def _serve_model(model: ServedModel, dest: Path) -> None:
    """Mirror one model into ``dest``/name, with its (possibly changed) config."""
    versions = {p.name for p in model.source.iterdir() if p.is_dir() and p.name.isdigit()}
    leave_out = {v for v in versions if int(v) not in model.versions}
    if model.config_changed:
        leave_out.add("config.pbtxt")
    _mirror(model.source, dest / model.name, leave_out)
    if model.config_changed:
        (dest / model.name / "config.pbtxt").write_text(text_format.MessageToString(model.config))
    for note in model.notes:
        logger.warning("model %s: %s", model.name, note)


def prepare_repository(repository: str | os.PathLike, dest: Path, *, device: str = "cpu",
                       skip_unservable: bool = False,
                       torch_ops_libraries: tuple[str, ...] = ()) -> PreparedRepository:
    """Plan ``repository`` and build its served mirror in ``dest`` (emptied first).

    Raises :class:`~coffea_sonic.errors.UnservableModelError` naming every refused model unless
    ``skip_unservable`` (then they are logged and listed in ``PreparedRepository.skipped``), and
    when nothing at all can be served.
    """
    repository = Path(repository).resolve()
    servable, refusals = plan_repository(repository, device=device,
                                         torch_ops_libraries=torch_ops_libraries)
    if refusals and not skip_unservable:
        raise UnservableModelError(refusal_message(repository, refusals), refusals)
    if not servable:
        message = (refusal_message(repository, refusals) if refusals
                   else f"model repository {repository} holds no model folder")
        raise UnservableModelError(f"nothing to serve: {message}", refusals)
    for refusal in refusals:
        logger.warning("skipping unservable %s", refusal.describe())
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for model in servable:
        _serve_model(model, dest)
        logger.info("serving %s (%s%s) versions %s", model.name, model.platform,
                    ", through the coffea-sonic adapter" if model.adapted else "",
                    list(model.versions))
    return PreparedRepository(dest, servable, refusals)


def _python_library(backend_dir: Path) -> Path:
    return backend_dir / "python" / "libtriton_python.so"


def install_adapters(backend_dir: Path, dest: Path) -> tuple[Path, list[str]]:
    """(backend folder ``dest`` with the adapters, library folders for ``LD_LIBRARY_PATH``).

    ``backend_dir`` is the launcher's backend folder (its ``python/`` holds the library, maybe as
    a symlink into the wheel, and the stub); ``dest`` gets a copy of the library, symlinks to the
    rest, and ``onnxruntime/model.py`` / ``pytorch/model.py``. ``backend_dir`` is not changed.
    """
    source_library = _python_library(backend_dir).resolve()
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for entry in (backend_dir / "python").iterdir():
        target = python_dir / entry.name
        if entry.name == source_library.name:
            if target.is_symlink() or not target.exists():
                target.unlink(missing_ok=True)
                shutil.copyfile(source_library, target)
        elif not target.exists() and not target.is_symlink():
            target.symlink_to(entry.resolve())
    templates = resources.files("coffea_sonic.server")
    for backend in ADAPTED:
        (dest / backend).mkdir(exist_ok=True)
        template = "fil_model.py.tmpl" if backend == "fil" else "adapter_model.py.tmpl"
        (dest / backend / "model.py").write_text((templates / template).read_text())
    # the FIL backend runs the same tree code as the in-process engine
    forest = resources.files("coffea_sonic.engines") / "forest.py"
    (dest / "fil" / "tree_forest.py").write_text(forest.read_text())
    # the wheel's layout: <site>/pytriton/tritonserver/backends/python/ -> <site>/nvidia_pytriton.libs
    libraries = source_library.parents[4] / "nvidia_pytriton.libs"
    return dest, [str(libraries)] if libraries.is_dir() else []
