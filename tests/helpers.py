"""Small helpers shared by several test modules."""

from __future__ import annotations

import pickletools


def pickled_class_names(blob: bytes) -> set[str]:
    """Every ``module name`` global a pickle refers to (what unpickling would import)."""
    names, recent = set(), []
    for opcode, argument, _ in pickletools.genops(blob):
        if isinstance(argument, str):
            recent.append(argument)
        if opcode.name in ("GLOBAL", "INST"):
            names.add(str(argument))
        elif opcode.name == "STACK_GLOBAL":
            names.add(" ".join(recent[-2:]))
    return names
