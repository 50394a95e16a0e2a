"""The server's own environment and the errors of a client-only install (no mocks: real Pythons,
real venvs, real pip from a wheel folder without the package index)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coffea_sonic import errors
from coffea_sonic.errors import ConfigurationError, MissingDependencyError
from coffea_sonic.server import environment


def test_a_feature_whose_extra_is_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(errors.EXTRAS, "coffea_sonic_absent_module", "onnx")
    with pytest.raises(MissingDependencyError) as caught:
        errors.require("coffea_sonic_absent_module", "CpuEngine('jet_tagger')")
    message = str(caught.value)
    assert "CpuEngine('jet_tagger') needs coffea_sonic_absent_module" in message
    assert "pip install 'coffea-sonic[onnx]'" in message


def test_a_module_whose_own_dependency_is_broken_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "coffea_sonic_broken_module.py").write_text("import coffea_sonic_absent_inner\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as caught:
        errors.require("coffea_sonic_broken_module", "a feature")
    assert not isinstance(caught.value, MissingDependencyError)
    assert caught.value.name == "coffea_sonic_absent_inner"


def test_this_environment_runs_the_server_when_it_has_pytriton_and_numpy_1(monkeypatch):
    pytest.importorskip("pytriton")
    monkeypatch.delenv(environment.ENV_SETTING, raising=False)
    found = environment.resolve(build=False)
    if found.problem() is None and environment.is_this_interpreter(found):
        assert found.server_dir.joinpath("bin", "tritonserver").is_file()
    else:
        pytest.skip(f"this environment cannot run the server: {found.problem()}")


def test_the_setting_names_an_environment_and_one_without_pytriton_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(environment.ENV_SETTING, sys.prefix)
    assert environment.resolve(build=False).python == Path(sys.prefix) / "bin" / "python"
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    monkeypatch.setenv(environment.ENV_SETTING, str(bare))
    with pytest.raises(ConfigurationError) as caught:
        environment.resolve()
    assert f"{environment.ENV_SETTING}={bare}" in str(caught.value)
    assert "nvidia-pytriton is not installed" in str(caught.value)


def test_without_a_python_the_stubs_support_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setenv(environment.PYTHON_SETTING, "/bin/false")
    with pytest.raises(MissingDependencyError) as caught:
        environment.find_python()
    message = str(caught.value)
    assert "Python 3.8-3.12" in message and "/bin/false" in message
    assert environment.ENV_SETTING in message and "apt-get install python3.11" in message


def _tiny_wheel(folder: Path) -> Path:
    """A real wheel built here, without the package index."""
    project = folder / "project"
    (project / "coffea_sonic_tiny").mkdir(parents=True)
    (project / "coffea_sonic_tiny" / "__init__.py").write_text("VALUE = 42\n")
    (project / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "coffea-sonic-tiny"
        version = "1.0"
        """))
    wheels = folder / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(wheels), str(project)],
                   check=True, capture_output=True)
    return wheels


def test_the_server_environment_builds_from_a_wheel_folder_once_and_is_reused(tmp_path,
                                                                               monkeypatch):
    monkeypatch.setenv("COFFEA_SONIC_CACHE", str(tmp_path / "cache"))
    wheels = _tiny_wheel(tmp_path)
    built = environment.install(sys.executable, wheels=wheels, requirements=("coffea-sonic-tiny",))
    assert str(built.python).startswith(str(tmp_path / "cache" / "server-env"))
    value = subprocess.run([str(built.python), "-c", "import coffea_sonic_tiny as t; print(t.VALUE)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert value == "42"
    done = built.python.parent.parent / environment.DONE
    first = done.stat().st_mtime_ns
    again = environment.install(sys.executable, wheels=wheels, requirements=("coffea-sonic-tiny",))
    assert again.python == built.python and done.stat().st_mtime_ns == first
    assert not list((tmp_path / "cache" / "server-env").glob("*.building-*"))
