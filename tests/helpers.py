"""Small helpers shared by several test modules."""

from __future__ import annotations

import pickletools

from coffea_sonic.transport.channel import get_connection
from coffea_sonic.transport.codec import decode_response, encode_request


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


def grpc_reference(address: str, name: str, inputs: dict) -> dict:
    """Outputs over plain gRPC, tensors in the message: the reference other transports must equal."""
    response = get_connection(address).stub.ModelInfer(encode_request(name, "", inputs), timeout=60)
    return decode_response(response)
