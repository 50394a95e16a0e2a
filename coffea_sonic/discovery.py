"""What each server serves, and whether they agree about a model: :class:`Discovery`.

How it works, with examples: docs/internals/routing.md.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from .core.tensors import ModelInfo
from .endpoints import Endpoint
from .errors import InferenceError, ModelNotFoundError, ServerUnavailableError
from .transport.errors import TransportError, to_sonic_error

__all__ = ["Discovery"]

logger = logging.getLogger(__name__)


class Discovery:
    """Discovery and signatures of the servers of one router (docs/internals/routing.md).

    ``mark_failed(endpoint, detail)`` quarantines a server that cannot be reached;
    ``describe(model, version)`` states every server for error messages.
    """

    def __init__(self, endpoints: Sequence[Endpoint], *, connect_timeout_s: float,
                 mark_failed: Callable[[Endpoint, str], None],
                 describe: Callable[..., str]) -> None:
        self._endpoints = list(endpoints)
        self._connect_timeout_s = connect_timeout_s
        self._mark_failed = mark_failed
        self._describe = describe
        #: (model, version) -> reference checksum, checked on every (re-)admitted server
        self._signatures: dict[tuple[str, str], str] = {}
        self._infos: dict[tuple[str, str, str], ModelInfo] = {}

    def discover(self, endpoints: Sequence[Endpoint] | None = None, *, force: bool = False) -> None:
        """Ask servers not yet discovered what they serve (all at once, in parallel); ``force``
        asks quarantined ones too (docs/internals/routing.md)."""
        pending = [e for e in (self._endpoints if endpoints is None else endpoints)
                   if force or (e.served is None and e.healthy)]
        if not pending:
            return
        with ThreadPoolExecutor(len(pending), thread_name_prefix="csonic-discover") as pool:
            answers = list(pool.map(self._index, pending))
        for endpoint, answer in zip(pending, answers):
            if isinstance(answer, TransportError):
                if answer.kind == "restricted":
                    endpoint.index_restricted, endpoint.served = True, {}
                    logger.info("coffea-sonic: %s restricts its repository index; asking for "
                                "each model instead", endpoint.address)
                else:
                    self._failed(endpoint, answer, "(repository index)")
                continue
            endpoint.index_restricted, endpoint.served = False, answer

    def _failed(self, endpoint: Endpoint, error: TransportError, model: str,
                version: str = "") -> None:
        """Raise the error of a server that answered (e.g. it refused our token), or quarantine
        one that did not."""
        if error.outcome == "other":
            raise to_sonic_error(error, model=model, version=version, address=endpoint.address,
                                 credentials=endpoint.settings.credential_source()) from None
        self._mark_failed(endpoint, error.describe())

    def _index(self, endpoint: Endpoint) -> dict[str, tuple[str, ...]] | TransportError:
        try:
            return endpoint.transports.control().model_index(self._connect_timeout_s)
        except TransportError as error:
            return error
        except Exception as error:  # noqa: BLE001 - e.g. unreadable TLS files
            return TransportError("down", f"{type(error).__name__}: {error}",
                                  address=endpoint.address)

    def learn(self, endpoint: Endpoint, model: str, timeout_s: float) -> None:
        """Fill ``endpoint.served[model]`` from the model's metadata (restricted index)."""
        if not endpoint.index_restricted or endpoint.served is None or model in endpoint.served:
            return
        try:
            info = self._info(endpoint, model, "", timeout_s)
        except TransportError as error:
            if error.kind == "not_found":
                endpoint.served[model] = ()
            else:
                self._failed(endpoint, error, model)
            return
        endpoint.served[model] = info.versions

    def _info(self, endpoint: Endpoint, model: str, version: str, timeout_s: float,
              refresh: bool = False) -> ModelInfo:
        key = (endpoint.address, model, version)
        info = None if refresh else self._infos.get(key)
        if info is None:
            control = endpoint.transports.control()
            info = self._infos[key] = control.model_info(model, version, timeout_s)
        return info

    def model_info(self, model: str, version: str, *,
                   timeout_s: float, expected_checksum: str | None = None) -> tuple[ModelInfo, str]:
        """The model's signature and the version requests will carry, checked on every server.

        Unpinned (``version == ""``): the highest version any reachable server has. Raises
        ``ModelNotFoundError`` if no reachable server serves it, ``InferenceError`` if two servers
        (or a server and ``expected_checksum``) disagree about its signature.
        """
        started = time.monotonic()
        self.discover()
        for endpoint in self._endpoints:
            if endpoint.healthy:
                self.learn(endpoint, model, timeout_s)
        reachable = [e for e in self._endpoints if e.served is not None and e.healthy]
        if not reachable:
            remembered = self._remembered(model, version)
            if remembered is not None:
                return remembered
            raise ServerUnavailableError(
                f"model {model!r}: no server reachable ({time.monotonic() - started:.1f} s; "
                f"connect_timeout_s {self._connect_timeout_s:g}); is the server running, and are "
                "the address and TLS setting right? " + self._describe(model, version))
        if not version:
            version = _latest_version(model, reachable)
        holders = [e for e in reachable if e.serves(model, version)]
        if not holders:
            what = f"model {model!r}" + (f" version {version}" if version else "")
            raise ModelNotFoundError(f"no server serves {what}: {_listing(model, reachable)}")
        reference = self._agreed_info(holders, model, version, timeout_s, expected_checksum)
        self._signatures[(model, version)] = reference.checksum
        return reference, version

    def _remembered(self, model: str, version: str) -> tuple[ModelInfo, str] | None:
        """The signature of ``model`` (``version``, or the latest known) that a now quarantined
        server gave this process before, once agreed on; None if there is none."""
        known = [e for e in self._endpoints if e.served is not None]
        version = version or _latest_version(model, known)
        checksum = self._signatures.get((model, version))
        if checksum is None:
            return None
        for endpoint in known:
            info = self._infos.get((endpoint.address, model, version))
            if info is not None and info.checksum == checksum:
                return info, version
        return None

    def _agreed_info(self, holders: Sequence[Endpoint], model: str, version: str,
                     timeout_s: float, expected_checksum: str | None) -> ModelInfo:
        """The signature every server of ``holders`` that answers declares (and
        ``expected_checksum``, if given, agrees with)."""
        reference: ModelInfo | None = None
        reference_address = ""
        for endpoint in holders:
            info = self.fetch_info(endpoint, model, version, timeout_s)
            if info is None:
                continue
            if expected_checksum and info.checksum != expected_checksum:
                raise InferenceError(
                    f"model {model!r} at {endpoint.address} has checksum (signature and served config) "
                    f"{info.checksum}, expected {expected_checksum}: the served model is not the "
                    f"one this analysis was written for ({info.describe()})")
            if reference is None:
                reference, reference_address = info, endpoint.address
            elif info.checksum != reference.checksum:
                raise InferenceError(
                    f"servers disagree about model {model!r} version {version or 'latest'}: "
                    f"{reference_address} serves {reference.describe()} (checksum "
                    f"{reference.checksum}) but {endpoint.address} serves {info.describe()} "
                    f"(checksum {info.checksum}); deploy the same model everywhere")
        if reference is None:
            raise ServerUnavailableError(
                f"model {model!r}: every server holding it failed to describe it; "
                + self._describe(model, version))
        return reference

    def fetch_info(self, endpoint: Endpoint, model: str, version: str,
                   timeout_s: float, refresh: bool = False) -> ModelInfo | None:
        try:
            return self._info(endpoint, model, version, timeout_s, refresh)
        except TransportError as error:
            self._failed(endpoint, error, model, version)
            return None

    def compatible(self, endpoint: Endpoint, timeout_s: float) -> bool:
        """Re-check the signatures of the models in use on a re-admitted server."""
        for (model, version), checksum in list(self._signatures.items()):
            try:
                self.learn(endpoint, model, timeout_s)
            except Exception:  # noqa: BLE001 - treated as not serving it
                continue
            if not endpoint.serves(model, version):
                continue
            info = self.fetch_info(endpoint, model, version, timeout_s, refresh=True)
            if info is None:
                return False
            if info.checksum != checksum:
                reason = (f"serves a different {model!r} (checksum {info.checksum}, expected "
                          f"{checksum}: {info.describe()})")
                endpoint.incompatible[model] = reason
                logger.error("coffea-sonic: server %s %s; not using it for %s",
                             endpoint.address, reason, model)
        return True


def _latest_version(model: str, reachable: Sequence[Endpoint]) -> str:
    """The highest numbered version of ``model`` any of ``reachable`` serves ("" if none)."""
    latest = [max((v for v in (e.served or {}).get(model, ()) if v.isdigit()), key=int, default="")
              for e in reachable]
    return max((v for v in latest if v), key=int, default="")


def _listing(model: str, reachable: Sequence[Endpoint]) -> str:
    """What each server serves, for the error of a model none of them serves."""
    def serves(endpoint: Endpoint) -> str:
        served = endpoint.served or {}
        if endpoint.index_restricted and not served.get(model):
            return "(its repository index is restricted)"
        return ", ".join(f"{name} (versions {', '.join(v) or '?'})"
                         for name, v in served.items() if v) or "nothing"

    return "; ".join(f"{e.address} serves {serves(e)}" for e in reachable)
