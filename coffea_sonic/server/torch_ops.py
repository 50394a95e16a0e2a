"""TorchScript models that need custom operator libraries (``torch.ops.<namespace>.<op>``).

How it works, with an example: docs/internals/standard-repositories.md, "TorchScript with custom
operators".
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Sequence

from ..errors import require

__all__ = ["OPTION", "load_libraries", "missing_operator_name", "torchscript_problem"]

#: How a user names an operator library to ``coffea-sonic serve``.
OPTION = "--torch-ops-library PATH (LocalTritonServer(torch_ops_libraries=[PATH]))"
_UNKNOWN_OP = re.compile(r"Unknown builtin op: ([\w:.]+?)\.?(?:\s|$)")
_loaded: set[str] = set()


def missing_operator_name(message: str) -> str | None:
    """The operator a TorchScript load error says is unknown, or None."""
    found = _UNKNOWN_OP.search(message)
    return found.group(1) if found else None


def load_libraries(paths: Sequence[str | os.PathLike]) -> None:
    """``torch.ops.load_library`` each path once per process (registers its operators)."""
    torch = require("torch", "loading TorchScript operator libraries")

    for path in paths:
        resolved = str(Path(path).resolve())
        if resolved not in _loaded:
            torch.ops.load_library(resolved)
            _loaded.add(resolved)


def _model_libraries(config, folder: Path) -> list[str]:
    if config is None:
        return []
    return [name if os.path.isabs(name) else str(folder / name)
            for name in config.model_operations.op_library_filename]


def torchscript_problem(path: Path, config, libraries: Sequence[str | os.PathLike]) -> str | None:
    """Why the TorchScript file at ``path`` cannot load with ``libraries`` (and the config's own
    ``model_operations``), or None. Loads the libraries into this process."""
    try:
        load_libraries([*libraries, *_model_libraries(config, path.parent.parent)])
    except (OSError, RuntimeError) as error:
        return (f"an operator library could not be loaded: {type(error).__name__}: "
                f"{str(error).strip().splitlines()[0]}")
    torch = require("torch", f"checking the TorchScript file {path}")

    try:
        with warnings.catch_warnings():  # torch.jit is deprecated, but it is what Triton serves
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.load(str(path), map_location="cpu")
    except Exception as error:  # noqa: BLE001 - the load error is the refusal
        operator = missing_operator_name(str(error))
        if operator is None:
            return f"{path.name} is not a TorchScript file torch.jit.load can read: {error}"
        given = f" (loaded: {', '.join(str(p) for p in libraries)})" if libraries else ""
        return (f"{path.name} calls operator {operator}, which no loaded library registers{given}: "
                f"give the library that provides it, {OPTION}; the official container loads "
                "it with LD_PRELOAD")
    return None
