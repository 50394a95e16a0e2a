"""The GPU benchmarks of coffea_sonic.bench.gpu start and explain their options on any machine,
under both names the GPU scripts use: ``python -m coffea_sonic.bench.gpu.NAME`` and the thin
caller ``python benchmarks/gpu/NAME.py``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coffea_sonic.bench.gpu import MODULES

ROOT = Path(__file__).resolve().parents[1]
GPU_PACKAGE = ROOT / "coffea_sonic" / "bench" / "gpu"


def _help(command: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, *command, "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", MODULES)
def test_gpu_benchmark_prints_its_usage_as_module_and_as_script(name):
    as_module = _help(["-m", f"coffea_sonic.bench.gpu.{name}"])
    assert as_module.returncode == 0, as_module.stderr
    assert as_module.stdout.startswith(f"usage: {name}.py "), as_module.stdout[:200]
    as_script = _help([f"benchmarks/gpu/{name}.py"])
    assert as_script.returncode == 0, as_script.stderr
    assert as_script.stdout == as_module.stdout


def test_every_runnable_gpu_module_is_listed():
    runnable = {path.stem for path in GPU_PACKAGE.glob("*.py")
                if any(isinstance(node, ast.FunctionDef) and node.name == "main"
                       for node in ast.parse(path.read_text()).body)}
    assert runnable == set(MODULES)
