"""Which transport carries one server's requests (how: docs/internals/transport.md)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from ..core.endpoint import ServerSettings
from ..errors import ConfigurationError
from .base import Transport
from .errors import TransportError
from .registry import open_transport

__all__ = ["MAX_REPROBES", "ServerTransports"]

logger = logging.getLogger(__name__)

#: a server may forget our regions this many times per process before it gets plain requests
MAX_REPROBES = 3

class ServerTransports:
    """The control and data transports of one server, as this process uses them.

    ``requested``: a kind by name (``"auto"``, ``"grpc"``, ``"shm"``, ``"cuda"``, ``"http"``) or
    a factory ``f(ServerSettings) -> Transport`` (which then carries control calls too).
    """

    def __init__(self, settings: ServerSettings,
                 requested: str | Callable[[ServerSettings], Any] = "auto") -> None:
        self.settings = settings
        self.requested = requested
        #: the transport requests use (decided on first use)
        self.data: Transport | None = None
        #: the transport of requests for models the server runs on a GPU, where CUDA shared
        #: memory works with it (None: not tried yet)
        self.cuda: Transport | None = None
        #: why shared memory is not used with this server ("" while undecided or in use)
        self.shm_off = ""
        #: why CUDA shared memory is not used with this server ("" while undecided or in use)
        self.cuda_off = ""
        #: times the server forgot our regions and was probed again (see region_forgotten)
        self.reprobes = 0
        self._lock = threading.Lock()

    @property
    def plain(self) -> Transport:
        """The transport of the URL's protocol (gRPC or HTTP)."""
        return open_transport(self.settings, self.settings.protocol)

    def control(self) -> Transport:
        """The transport of control calls (a factory's transport, if one was given)."""
        if callable(self.requested):
            return self.requested(self.settings)
        return self.plain

    def data_transport(self, gpu_model: bool = False) -> Transport:
        """The transport requests use (chosen once); ``gpu_model``: the request's model runs on
        the server's GPU 0 only (:attr:`~coffea_sonic.core.tensors.ModelInfo.on_gpu_zero`)."""
        data = self.data
        if data is None or (data.name in ("shm", "cuda") and self.shm_off):
            data = self.data = self._choose()
        if gpu_model and data.name == "shm" and self.requested == "auto":
            return self._cuda_transport() or data
        return data

    def kind(self, gpu_model: bool = False) -> str:
        """The kind of :meth:`data_transport` (``"grpc"`` where the choice raises: the request
        that makes it will report the error)."""
        try:
            return self.data_transport(gpu_model).name
        except TransportError:
            return "grpc"

    def disable_shm(self, why: str, quiet: bool = False) -> None:
        """Stop using shared memory with this server (logged once); requests go over its URL's
        protocol from now on."""
        with self._lock:
            if self.shm_off:
                return
            self.shm_off = why or "shared memory failed"
        log = logger.info if quiet else logger.warning
        log("coffea-sonic: not using shared memory with %s (%s); sending tensors over %s",
            self.settings.address, self.shm_off, self.settings.protocol)

    def region_forgotten(self, why: str) -> None:
        """The server answered that it does not know one of our regions: probe it again (at most
        :data:`MAX_REPROBES` times; why: docs/internals/transport.md)."""
        with self._lock:
            self.reprobes += 1
            again = self.reprobes <= MAX_REPROBES and not self.shm_off
        if again:
            from .shm.select import forget_probe, probe_shared_memory

            forget_probe(self.plain)
            usable, detail = probe_shared_memory(self.plain)
            if usable:
                logger.info("coffea-sonic: %s forgot our shared-memory regions (%s); registering "
                            "new ones", self.settings.address, why)
                return
            why = f"{why}; probed again: {detail}"
        self.disable_shm(why)

    def _cuda_decided(self) -> bool:
        return self.cuda is not None or bool(self.cuda_off)

    def _cuda_transport(self) -> Transport | None:
        """The CUDA shared-memory transport, or None where it does not work."""
        if self._cuda_decided():
            return self.cuda
        with self._lock:
            if self._cuda_decided():  # another thread probed while this one waited
                return self.cuda
            try:
                from .shm.cuda import probe_cuda_shared_memory

                usable, why = probe_cuda_shared_memory(self.plain)
                if usable:
                    self.cuda = open_transport(self.settings, "cuda")
            except Exception as error:  # noqa: BLE001 - e.g. CUDA unusable after a fork
                usable, why = False, f"{type(error).__name__}: {error}"
            if not usable:
                self.cuda_off = why or "CUDA shared memory failed"
        logger.info("coffea-sonic: GPU models of %s: %s", self.settings.address,
                    "CUDA shared memory" if self.cuda is not None
                    else f"system shared memory ({self.cuda_off})")
        return self.cuda

    def _choose(self) -> Transport:
        requested, settings = self.requested, self.settings
        if callable(requested):
            return requested(settings)
        if requested == "http" and settings.protocol != "http":
            raise ConfigurationError(
                f"transport='http' needs triton+http:// URLs (the server's HTTP port), not "
                f"{settings.address} over gRPC")
        if requested == "grpc" or settings.protocol == "http":  # "http" with such a URL
            return self.plain
        if self.shm_off:
            if requested in ("shm", "cuda"):
                raise ConfigurationError(
                    f"transport={requested!r}: cannot use shared memory with {settings.address} "
                    f"({self.shm_off}); use transport='auto' or 'grpc'")
            return self.plain
        from .shm import probe_shared_memory, shm_possible

        usable, why = (False, "the server is not on this host")
        if shm_possible(settings.address):
            usable, why = probe_shared_memory(self.plain)
        if not usable:
            self.disable_shm(why, quiet=requested == "auto")
            return self._choose()
        return open_transport(settings, "cuda" if requested == "cuda" else "shm")
