#!/usr/bin/env python3
"""The project's two commands, for a fresh machine with only Python >= 3.11 and the package index.

    python3 dev.py demo [demo options]    # the main job: sample + embedded Triton + Dask + plot
    python3 dev.py test [pytest options]  # the whole test suite (what CI runs)

``test`` then installs coffea-sonic's core beside the newest coffea/dask/numpy 2 and beside the
oldest supported coffea, and runs the client suites there (scripts/dev_stacks.py says how).

Both create ``.venv`` beside this file on first use and install the project with every extra into
it (``pip install -e '.[all,test]' -c constraints/dev.txt``: pyproject.toml holds the ranges users
get, constraints/dev.txt the one tested set); they reinstall only when either file changes.
Anything else is passed to ``coffea-sonic`` inside that environment: ``python3 dev.py serve``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".coffea-sonic-installed"
CONSTRAINTS = ROOT / "constraints" / "dev.txt"


def ensure_environment() -> None:
    """Create .venv and install the project into it unless pyproject.toml is unchanged since."""
    if sys.version_info < (3, 11):
        sys.exit(f"coffea-sonic needs Python >= 3.11; this is {sys.version.split()[0]}")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()
                            + CONSTRAINTS.read_bytes()).hexdigest()
    if PYTHON.exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not PYTHON.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("installing coffea-sonic with all extras into .venv (about a minute)", flush=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "-e", f"{ROOT}[all,test,docs]", "-c", str(CONSTRAINTS)], check=True, cwd=ROOT)
    STAMP.write_text(wanted)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    ensure_environment()
    command, rest = argv[0], argv[1:]
    env = dict(os.environ, PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    if command == "test":  # the development venv, then the client beside users' stacks
        sys.path.insert(0, str(ROOT / "scripts"))
        from dev_stacks import run_all

        return run_all(ROOT, PYTHON, rest, env)
    return subprocess.call([str(VENV / "bin" / "coffea-sonic"), command, *rest], env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
