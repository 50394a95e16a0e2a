"""Running the notebooks as a user would, with their parameters cell given test-sized values."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def run_notebook(name: str, tmp_path: Path, **parameters: object) -> str:
    """Execute notebooks/``name`` in ``tmp_path``, its parameters cell (the cell tagged
    ``parameters``) followed by ``parameters``; return everything it printed or displayed."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    (cell,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    cell.source += "".join(f"\n{key} = {value!r}" for key, value in parameters.items())
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return "".join(str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
                   for cell in notebook.cells for output in cell.get("outputs", []))
