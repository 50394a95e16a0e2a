"""System shared memory to a server on this host (how: docs/internals/transport-shm.md)."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...core.endpoint import ServerSettings
from ...core.process_local import ProcessLocal
from ...core.tensors import decode_tensor, triton_dtype
from ..base import InferAnswer, InferRequest, answer_from
from .common import Layout, SlotTransport, checked_output, shm_parameters, slot_message
from .pool import DEFAULT_MAX_SLOTS, Slot, SystemRegions

__all__ = ["SystemShmTransport"]

#: Inputs at least this large are copied into the region by ``copy_threads`` threads (why this
#: size: docs/internals/transport-shm.md).
PARALLEL_COPY_BYTES = 8 << 20

#: copy threads per thread count (a forked child has none of its parent's threads)
_copy_pools: ProcessLocal[int, ThreadPoolExecutor] = ProcessLocal("shared-memory copy threads")


class SystemShmTransport(SlotTransport):
    """Requests to one Triton server on this host, tensors through system shared memory.

    ``settings``: the server (``ServerSettings``; a ``host:port`` string is accepted).
    ``max_slots``: regions, so requests in flight through shared memory at once; more requests
    travel inline. ``copy_threads``: threads that copy one large input (>= 8 MiB) into its region
    (numpy releases the GIL while copying); 1 copies in the caller's thread only.
    """

    name = "shm"

    def __init__(self, settings: ServerSettings | str, *, max_slots: int = DEFAULT_MAX_SLOTS,
                 copy_threads: int = 4) -> None:
        super().__init__(settings, SystemRegions(), max_slots)
        self.copy_threads = max(1, int(copy_threads))

    def __reduce__(self):
        # configuration only: the receiving process makes its own regions
        return (functools.partial(SystemShmTransport, max_slots=self.max_slots,
                                  copy_threads=self.copy_threads), (self.settings,))

    def _message(self, request: InferRequest, slot: Slot, layout: Layout) -> Any:
        message = slot_message(request, slot, layout)
        for name, array in request.inputs.items():
            offset, nbytes = layout.inputs[name]
            self._copy_in(slot.region.view(offset, array.dtype, array.shape), array)
            tensor = message.inputs.add(name=name, datatype=triton_dtype(array.dtype),
                                        shape=array.shape)
            shm_parameters(tensor, slot.name, offset, nbytes)
        return message

    def _copy_in(self, target: np.ndarray, source: np.ndarray) -> None:
        threads = self.copy_threads
        if (threads == 1 or source.nbytes < PARALLEL_COPY_BYTES or source.ndim == 0
                or len(source) < threads):
            np.copyto(target, source, casting="no")
            return
        bounds = np.linspace(0, len(source), threads + 1).astype(int)
        pool = _copy_pools.get(threads, lambda: ThreadPoolExecutor(
            threads, thread_name_prefix="csonic-copy"))
        jobs = [pool.submit(np.copyto, target[a:b], source[a:b], casting="no")
                for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for job in jobs:
            job.result()

    def _read(self, response: Any, request: InferRequest, slot: Slot, layout: Layout,
              context: Any) -> InferAnswer:
        raw = list(response.raw_output_contents)
        if len(raw) == len(response.outputs):
            raw_of = {tensor.name: content for tensor, content in zip(response.outputs, raw)}
        else:  # only outputs outside shared memory have raw contents
            raw_of = dict(zip((t.name for t in response.outputs if t.name not in layout.outputs),
                              raw))
        views: dict[str, np.ndarray] = {}
        inline: dict[str, np.ndarray] = {}
        for tensor in response.outputs:
            if tensor.name in layout.outputs:
                dtype, shape, offset = checked_output(tensor, layout, request.model)
                views[tensor.name] = slot.region.view(offset, dtype, shape)
            else:
                inline[tensor.name] = decode_tensor(tensor.name, tensor.datatype, tensor.shape,
                                                    raw_of.get(tensor.name, b""),
                                                    f"model {request.model!r} ")
        # the one copy: slot -> destination (or -> a fresh array when not deliverable)
        answer = answer_from(request, views, version=response.model_version, copy=True)
        if inline:
            extra = answer_from(request, inline, version=response.model_version)
            answer.outputs.update(extra.outputs)
            answer.delivered |= extra.delivered
            answer.nbytes += extra.nbytes
            answer.outputs = {t.name: answer.outputs[t.name] for t in response.outputs}
        return answer
