"""Running the notebooks as a user would, with their parameters cell given test-sized values."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
#: a cell that runs longer has hung (the longest takes seconds here); below pytest's own timeout,
#: so the failure names the cell and the kernel is shut down before the next notebook starts
CELL_TIMEOUT_S = 240
#: when the kernel writes every thread's stack (faulthandler) to a file, to show where a hung
#: cell waits; a whole notebook takes well under this
STACKS_AFTER_S = 180


def run_notebook(name: str, tmp_path: Path, *, notebooks: Path = NOTEBOOKS,
                 cell_timeout_s: float = CELL_TIMEOUT_S, stacks_after_s: float = STACKS_AFTER_S,
                 **parameters: object) -> str:
    """Execute notebooks/``name`` in ``tmp_path``, its parameters cell (the cell tagged
    ``parameters``) followed by ``parameters``; return everything it printed or displayed.

    A cell that runs past ``cell_timeout_s`` fails the call with that cell and the kernel's
    threads as they were ``stacks_after_s`` after the notebook started."""
    notebook = nbformat.read(notebooks / name, as_version=4)
    (cell,) = [cell for cell in notebook.cells if "parameters" in cell.metadata.get("tags", [])]
    cell.source += "".join(f"\n{key} = {value!r}" for key, value in parameters.items())
    stacks = tmp_path / f"{Path(name).stem}-kernel-stacks.txt"
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        "import faulthandler as _faulthandler\n"
        f"_faulthandler.dump_traceback_later({stacks_after_s!r}, "
        f"file=open({str(stacks)!r}, 'w'))"))
    try:
        NotebookClient(notebook, timeout=cell_timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    except CellTimeoutError as error:
        dumped = stacks.read_text() if stacks.exists() else "(none written)"
        raise AssertionError(f"{name}: {error}\nthe kernel's threads {stacks_after_s:g} s after "
                             f"the notebook started:\n{dumped}") from None
    return "".join(str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
                   for cell in notebook.cells for output in cell.get("outputs", []))
