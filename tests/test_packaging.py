"""coffea-sonic builds as a user builds it: ``pip wheel .`` and ``python -m build`` (sdist, then the
wheel from the sdist) on a copy of the checkout's files, each with build isolation as a user gets
it. The wheel holds every module and data file of the package (the zoo's models, the server's
templates) and nothing else (no tests, benchmarks or notebooks), at the package's version.

That the wheel installs into a clean venv beside coffea without moving coffea's stack is proved
by ``python3 dev.py test``'s stack runs: scripts/dev_stacks.py installs this wheel there and
compares ``pip freeze`` before and after.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import coffea_sonic

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PACKAGE_FILES = sorted(
    path for path in subprocess.run(["git", "ls-files", "coffea_sonic"], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.splitlines()
    if (ROOT / path).is_file())


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The checkout's files as a fresh clone has them (tracked, and new files git does not
    ignore): no venv, build folder or cache of this checkout leaks into what is built."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    copy = tmp_path_factory.mktemp("clone") / "coffea-sonic"
    for relative in listed.splitlines():
        if (ROOT / relative).is_file():
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, copy / relative)
    return copy


def _run(*argv: str | Path, cwd: Path) -> None:
    result = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"


def _check_wheel(wheel: Path) -> None:
    assert wheel.name == f"coffea_sonic-{VERSION}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [path for path in PACKAGE_FILES if path not in names]
    assert not missing, f"package files missing from the wheel: {missing}"
    dist_info = f"coffea_sonic-{VERSION}.dist-info/"
    strays = sorted(n for n in names if not n.startswith(("coffea_sonic/", dist_info)))
    assert not strays, f"the wheel carries files outside the package: {strays[:20]}"
    metadata = zipfile.ZipFile(wheel).read(dist_info + "METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in metadata and coffea_sonic.__version__ == VERSION
    entry_points = zipfile.ZipFile(wheel).read(dist_info + "entry_points.txt").decode()
    assert "coffea-sonic = coffea_sonic.cli:main" in entry_points


def test_pip_wheel_builds_the_package_with_its_data_files_and_nothing_else(source, tmp_path):
    _run(sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps",
         "--quiet", "-w", tmp_path, ".", cwd=source)
    wheels = list(tmp_path.glob("*.whl"))
    assert len(wheels) == 1, wheels
    _check_wheel(wheels[0])


def test_python_build_makes_an_sdist_whose_wheel_is_the_whole_package(source, tmp_path):
    try:  # by its distribution: a checkout's build/ folder imports as a namespace package
        importlib.metadata.version("build")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the `build` frontend is not installed in this venv (the test extra's "
                    "build>=1.2)")
    _run(sys.executable, "-m", "build", "--outdir", tmp_path, ".", cwd=source)
    sdist = tmp_path / f"coffea_sonic-{VERSION}.tar.gz"
    assert sdist.is_file(), sorted(p.name for p in tmp_path.iterdir())
    prefix = f"coffea_sonic-{VERSION}/"
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(prefix) for name in archive.getnames()}
    assert {"pyproject.toml", "README.md"} <= names, sorted(names)[:40]
    missing = [path for path in PACKAGE_FILES if path not in names]
    assert not missing, f"package files missing from the sdist: {missing}"
    # python -m build makes the wheel from the unpacked sdist: a file the sdist lost fails here
    _check_wheel(tmp_path / f"coffea_sonic-{VERSION}-py3-none-any.whl")
