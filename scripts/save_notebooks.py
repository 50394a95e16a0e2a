"""Execute the notebooks as a user would and store them with their outputs.

Each notebook runs with its own defaults (its parameters cell as written) in a fresh folder, the
folder a user would open it from; paths under that folder are stored relative to it, so the saved
outputs read as they would on the user's machine and name no folder of ours. A notebook whose
outputs still hold a path of this machine (the run folder, the checkout, the venv, a home or
temporary folder) is not saved, and the command fails naming it.

    .venv/bin/python scripts/save_notebooks.py                  # all of notebooks/
    .venv/bin/python scripts/save_notebooks.py 01_quickstart    # one

tests/test_notebooks_and_demo.py checks the stored outputs for such paths.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
#: a path of the machine that ran the notebook: never in a stored output
MACHINE_PATH = re.compile(r"(/tmp/|/work/|/home/|/root/|/private/|\.venv/|site-packages)")


def _relative(value: object, folder: str) -> object:
    """``value`` (an output's text, a list of lines, or a mime bundle) with ``folder/`` removed."""
    if isinstance(value, str):
        return value.replace(folder + "/", "").replace(folder, ".")
    if isinstance(value, list):
        return [_relative(item, folder) for item in value]
    if isinstance(value, dict):
        return {key: _relative(item, folder) for key, item in value.items()}
    return value


def machine_paths(notebook: nbformat.NotebookNode) -> list[str]:
    """Output lines of ``notebook`` that name a path of the machine it ran on."""
    found = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []):
            text = str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
            text += "".join(output.get("traceback", []))
            found += [f"cell {index}: {line.strip()}" for line in text.splitlines()
                      if MACHINE_PATH.search(line)]
    return found


def save(path: Path) -> list[str]:
    """Run ``path`` in a fresh folder and store it; the machine paths left (nothing when saved)."""
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix=f"{path.stem}-") as folder_name:
        folder = str(Path(folder_name).resolve())
        NotebookClient(notebook, timeout=600, kernel_name="python3",
                       resources={"metadata": {"path": folder}}).execute()
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            for key in ("text", "data", "traceback"):
                if key in output:
                    output[key] = _relative(output[key], folder)
    left = machine_paths(notebook)
    if not left:
        nbformat.write(notebook, path)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebook names without .ipynb (default: all)")
    arguments = parser.parse_args(argv)
    paths = ([NOTEBOOKS / f"{name.removesuffix('.ipynb')}.ipynb" for name in arguments.names]
             or sorted(NOTEBOOKS.glob("*.ipynb")))
    failed = 0
    for path in paths:
        started = time.monotonic()
        left = save(path)
        took = time.monotonic() - started
        if left:
            failed += 1
            print(f"{path.name}: NOT saved ({took:.0f} s), its outputs name paths of this machine:")
            print("\n".join(f"  {line}" for line in left[:20]))
        else:
            print(f"{path.name}: saved ({took:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
