"""The embedded server's own Python environment: nvidia-pytriton, numpy < 2 and the served models' needs.

The tritonserver binary comes in the nvidia-pytriton wheel, which requires numpy < 2, and its
python-backend stubs exist for Python 3.8-3.12 only; under numpy 2 the stub garbles tensors. So the
server runs from an environment of its own while the user's environment keeps numpy 2:

* ``$COFFEA_SONIC_SERVER_ENV`` names an existing environment (a venv or conda prefix) to use;
* else this interpreter's own environment, when it has nvidia-pytriton, numpy < 2 and a stub;
* else a venv that ``coffea-sonic server install`` builds (or the first server start builds) under
  ``$COFFEA_SONIC_CACHE/server-env/``, cached and reused. Its Python is
  ``$COFFEA_SONIC_SERVER_PYTHON`` or the first of python3.12 ... python3.8 found on PATH.
  ``wheels=DIR`` installs from a local wheel folder only (machines without a package index).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigurationError, MissingDependencyError, ServerStartError

logger = logging.getLogger(__name__)

#: Names an existing environment (its prefix: ``bin/python`` inside) that the server runs from.
ENV_SETTING = "COFFEA_SONIC_SERVER_ENV"
#: The Python a new server environment is built with.
PYTHON_SETTING = "COFFEA_SONIC_SERVER_PYTHON"
#: Python versions nvidia-pytriton 0.7.0 ships python-backend stubs for, preferred first.
STUB_VERSIONS = ("3.12", "3.11", "3.10", "3.9", "3.8")
#: What the served models import (model.py.tmpl: onnxruntime on CPU, torch on GPU and for
#: TorchScript / trackgnn models; the zoo's generated ONNX files are exported with torch and onnx;
#: the FIL backend reads tree models with XGBoost, LightGBM and Treelite).
#: One tested set (Debian 12, CPython 3.11 and 3.12); numpy < 2 for the python backend.
SERVER_REQUIREMENTS = ("nvidia-pytriton==0.7.0", "numpy==1.26.4", "onnxruntime==1.32.0",
                       "onnx==1.23.2", "torch==2.13.0", "xgboost==3.2.0", "lightgbm==4.7.0",
                       "treelite==4.8.1")
#: Marks a finished build.
DONE = ".coffea-sonic-server-env"
#: Seconds a build may take (torch alone is several hundred MB).
BUILD_TIMEOUT_S = 1800

_DESCRIBE = """
import importlib.util, json, sys, sysconfig
spec = importlib.util.find_spec("pytriton")
try:
    import numpy
    numpy_version = numpy.__version__
except ImportError:
    numpy_version = None
print(json.dumps({"version": "%d.%d" % sys.version_info[:2], "executable": sys.executable,
                  "prefix": sys.prefix, "libdir": sysconfig.get_config_var("LIBDIR") or "",
                  "pytriton": list(spec.submodule_search_locations)[0] if spec else None,
                  "numpy": numpy_version}))
"""


@dataclass(frozen=True)
class ServerEnvironment:
    """A Python environment the tritonserver of nvidia-pytriton runs from (binary, stub, PATH).

    >>> ServerEnvironment(Path("/env/bin/python"), "3.11", "/usr/lib", Path("/p"), "1.26.4").bin_dir
    PosixPath('/env/bin')
    """

    python: Path
    version: str
    libdir: str
    pytriton_dir: Path | None
    numpy: str | None

    @classmethod
    def describe(cls, python: str | os.PathLike) -> "ServerEnvironment":
        """Ask ``python`` about itself (version, LIBDIR, nvidia-pytriton, numpy)."""
        try:
            answer = subprocess.run([str(python), "-I", "-c", _DESCRIBE], capture_output=True,
                                    text=True, timeout=60, env=_clean_environment())
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ConfigurationError(f"could not run {python}: {error}") from None
        if answer.returncode != 0:
            raise ConfigurationError(f"{python} failed: {answer.stderr.strip()[-500:]}")
        facts = json.loads(answer.stdout.strip().splitlines()[-1])
        return cls(Path(python), facts["version"], facts["libdir"],
                   Path(facts["pytriton"]) if facts["pytriton"] else None, facts["numpy"])

    @property
    def bin_dir(self) -> Path:
        return self.python.parent

    @property
    def server_dir(self) -> Path:
        """The ``pytriton/tritonserver`` folder (binary, backends, stubs)."""
        if self.pytriton_dir is None:
            raise MissingDependencyError(
                f"{self.python} has no nvidia-pytriton (the wheel that ships tritonserver): run "
                "`coffea-sonic server install`, or pip install 'coffea-sonic[server]' there")
        return self.pytriton_dir / "tritonserver"

    def problem(self) -> str | None:
        """Why the server cannot run from here (None: it can)."""
        if self.pytriton_dir is None:
            return "nvidia-pytriton is not installed"
        if self.numpy is None:
            return "numpy is not installed"
        if int(self.numpy.split(".")[0]) >= 2:
            return f"numpy is {self.numpy} (the python backend needs numpy < 2)"
        if self.version not in STUB_VERSIONS:
            return f"Python {self.version} has no python-backend stub (stubs: {STUB_VERSIONS})"
        return None


def _clean_environment() -> dict[str, str]:
    """This process's environment without what would make another Python import our packages."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(name, None)
    return env


def _this_interpreter() -> ServerEnvironment | None:
    import importlib.util
    import sysconfig

    spec = importlib.util.find_spec("pytriton")
    try:
        import numpy
    except ImportError:
        return None
    return ServerEnvironment(
        Path(sys.executable), f"{sys.version_info[0]}.{sys.version_info[1]}",
        sysconfig.get_config_var("LIBDIR") or "",
        Path(list(spec.submodule_search_locations)[0]) if spec else None, numpy.__version__)


def cache_root() -> Path:
    """Where built server environments live: ``$COFFEA_SONIC_CACHE/server-env``.

    >>> cache_root().name
    'server-env'
    """
    from ..zoo import cache_dir

    return cache_dir() / "server-env"


def find_python() -> Path:
    """A Python the python-backend stubs support: ``$COFFEA_SONIC_SERVER_PYTHON`` or one on PATH.

    >>> ServerEnvironment.describe(find_python()).version in STUB_VERSIONS
    True
    """
    named = os.environ.get(PYTHON_SETTING)
    candidates = [named] if named else (
        [sys.executable] + [f"python{version}" for version in STUB_VERSIONS])
    tried = []
    for candidate in candidates:
        path = shutil.which(candidate) if os.sep not in candidate else candidate
        if path is None:
            continue
        try:
            found = ServerEnvironment.describe(path)
        except ConfigurationError as error:
            tried.append(f"{path} ({error})")
            continue
        if found.version in STUB_VERSIONS:
            return Path(path)
        tried.append(f"{path} (Python {found.version})")
    raise MissingDependencyError(
        f"the embedded tritonserver needs a Python {STUB_VERSIONS[-1]}-{STUB_VERSIONS[0]} for its "
        f"own environment (nvidia-pytriton's python-backend stubs); tried "
        f"{', '.join(tried) or 'nothing found on PATH'}. Install one (e.g. apt-get install "
        f"python3.11 python3.11-venv, pyenv install 3.12, conda create -p DIR python=3.12) and "
        f"set {PYTHON_SETTING} to it, or set {ENV_SETTING} to an environment that has "
        f"nvidia-pytriton and numpy < 2")


def _key(python: Path, requirements: tuple[str, ...]) -> str:
    version = ServerEnvironment.describe(python).version
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:10]
    return f"py{version}-{digest}"


def install(python: str | os.PathLike | None = None, wheels: str | os.PathLike | None = None,
            requirements: tuple[str, ...] = SERVER_REQUIREMENTS,
            force: bool = False) -> ServerEnvironment:
    """Build (or reuse) the cached server environment; return it.

    ``wheels``: a folder of wheels to install from, without a package index. The venv is built
    beside its final place and renamed into it, so a half-built one is never used.
    """
    python = Path(python) if python is not None else find_python()
    prefix = cache_root() / _key(python, tuple(requirements))
    if (prefix / DONE).exists() and not force:
        return ServerEnvironment.describe(prefix / "bin" / "python")
    building = prefix.with_name(f"{prefix.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    logger.warning("building the embedded server's environment in %s with %s (once; minutes)",
                   prefix, python)
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    steps = [[str(python), "-m", "venv", str(building)],
             [str(building / "bin" / "python"), "-m", "pip", "install", "--quiet",
              "--disable-pip-version-check", *source, *requirements]]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                env=_clean_environment())
        if result.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            raise ServerStartError(
                f"building the server environment failed: {' '.join(step)}\n"
                f"{result.stderr.strip()[-2000:]}")
    (building / DONE).write_text("\n".join(requirements) + "\n")
    if force:
        shutil.rmtree(prefix, ignore_errors=True)
    try:  # bin/python finds its site-packages through pyvenv.cfg beside it: a venv may move
        os.rename(building, prefix)
    except OSError:  # another process finished first: use its environment
        shutil.rmtree(building, ignore_errors=True)
    return ServerEnvironment.describe(prefix / "bin" / "python")


def resolve(build: bool = True) -> ServerEnvironment:
    """The environment the server runs from (see the module's docstring for the order).

    ``build=False``: an environment not built yet raises instead of being built.
    """
    named = os.environ.get(ENV_SETTING)
    if named:
        path = Path(named)
        environment = ServerEnvironment.describe(path if path.is_file() else path / "bin" / "python")
        problem = environment.problem()
        if problem:
            raise ConfigurationError(f"{ENV_SETTING}={named} cannot run the server: {problem}")
        return environment
    here = _this_interpreter()
    if here is not None and here.problem() is None:
        return here
    logger.info("this environment cannot run the embedded server (%s): using its own environment",
                here.problem() if here else "numpy is not installed")
    if not build:
        python = find_python()
        prefix = cache_root() / _key(python, SERVER_REQUIREMENTS)
        if not (prefix / DONE).exists():
            raise MissingDependencyError(
                f"the server environment is not built yet ({prefix}): coffea-sonic server install")
        return ServerEnvironment.describe(prefix / "bin" / "python")
    return install()


def is_this_interpreter(environment: ServerEnvironment) -> bool:
    """Whether ``environment`` is the one this process runs in."""
    return Path(environment.python) == Path(sys.executable)


#: Settings that, all four set, say where the server, its backends and its Python come from.
OVERRIDES = ("TRITONSERVER_BIN", "TRITON_BACKEND_DIR", "TRITON_SERVER_PATH",
             "TRITON_SERVER_LD_LIBRARY_PATH")


def overridden() -> bool:
    """Whether the launcher's overrides name everything (then no environment is looked for).

    >>> overridden() == all(os.environ.get(name) for name in OVERRIDES)
    True
    """
    return all(os.environ.get(name) for name in OVERRIDES)


def export_generated_models(environment: ServerEnvironment | None, names: list[str] | None) -> None:
    """Export the zoo's generated models (torch) in the server's environment when torch is not here.

    A client-only install has no torch; the server's environment has it. Only this package's own
    folder is put on that Python's path, never the user's site-packages (their numpy 2).
    """
    import importlib.util
    import tempfile

    from .. import zoo

    if environment is None or is_this_interpreter(environment) or importlib.util.find_spec("torch"):
        return
    wanted = [name for name in (names if names is not None else zoo.names())
              if name in zoo.names() and not zoo.spec(name).shipped]
    if not wanted:
        return
    package = Path(zoo.__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="coffea-sonic-path-") as path_dir:
        (Path(path_dir) / package.name).symlink_to(package)
        env = dict(_clean_environment(), PYTHONPATH=path_dir)
        for name in wanted:
            result = subprocess.run(
                [str(environment.python), "-c",
                 "import sys; from coffea_sonic import zoo; print(zoo.onnx_path(sys.argv[1]))", name],
                capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env)
            if result.returncode != 0:
                raise ServerStartError(f"exporting zoo model {name} in the server environment "
                                       f"({environment.python}) failed:\n{result.stderr[-2000:]}")
