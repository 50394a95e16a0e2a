"""The repository stands on its own: no project file points outside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".py", ".sh", ".md", ".toml", ".yml", ".yaml", ".ipynb", ".cfg", ".txt", ".tmpl")


def test_no_project_file_refers_to_folders_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    outside = [f"{name}:{number}" for name in tracked if name.endswith(TEXT)
               and name != "tests/test_repository_files.py"
               for number, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
               if "../shared" in line]
    assert not outside, f"files that need a folder beside the repository: {outside}"
