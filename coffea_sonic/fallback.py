"""The fallback (SONIC's "fallback server"): run a model locally when no server can serve it.

The choices (``"off"``, ``"cpu"``, ``"local"``, a factory): docs/internals/routing.md.

>>> resolve_fallback("off") is None, resolve_fallback(True), resolve_fallback("CPU")
(True, 'cpu', 'cpu')
"""

from __future__ import annotations

import importlib
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Union

import numpy as np

from . import config
from .core.process_local import ProcessLocal
from .errors import ConfigurationError

__all__ = ["BUILTIN", "FallbackChoice", "declared_info", "fallback_engine", "reference_engine",
           "resolve_fallback", "submit", "warn_fallback"]

logger = logging.getLogger("coffea_sonic.fallback")

Engine = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
FallbackChoice = Union[None, bool, str, Callable[[str], Engine]]

#: The built-in fallbacks, implemented by the layers above the client (engines, the embedded
#: server, the zoo) and found by name, so the client never imports what imports it.
BUILTIN: dict[str, dict[str, str]] = {
    "cpu": {"engine": "coffea_sonic.engines:fallback_engine",
            "info": "coffea_sonic.engines:declared_info",
            "reference": "coffea_sonic.engines:reference_engine"},
    "local": {"engine": "coffea_sonic.server.fallback:local_fallback_engine",
              "info": "coffea_sonic.server.fallback:declared_info"},
}

_OFF = {"", "off", "none", "false", "no", "0"}
_CPU = {"cpu", "on", "true", "yes", "1", "engine"}


def resolve_fallback(value: FallbackChoice) -> str | Callable[[str], Engine] | None:
    """Normalise a fallback choice: None (off), ``"cpu"``, ``"local"`` or a factory.

    ``value`` None means "use the configured setting" (default off).
    """
    if value is None:
        value = config.setting("fallback", "off")
    if value is False:
        return None
    if value is True:
        return "cpu"
    if callable(value):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _OFF:
            return None
        if lowered in _CPU:
            return "cpu"
        if lowered == "local":
            return "local"
    raise ConfigurationError(
        f"fallback must be 'off', 'cpu', 'local' or a callable factory(model) -> engine, "
        f"not {value!r}")


#: this process' engines, fallback thread and last warning per model: a forked child makes its
#: own and never finalizes its parent's (one would stop the parent's fallback server; others may
#: wait on the parent's threads, which do not exist there)
_engines: ProcessLocal[tuple, Engine] = ProcessLocal("fallback engines")
_executors: ProcessLocal[str, ThreadPoolExecutor] = ProcessLocal("fallback thread")
_last_warning: ProcessLocal[str, float] = ProcessLocal("fallback warnings")


def fallback_engine(choice: str | Callable[[str], Engine], model: str,
                    version: str = "") -> Engine:
    """The (cached, per process) engine that runs ``model`` for fallback ``choice``; a built-in
    one runs ``version`` of it where the model has several (a tree model's), a factory gets the
    name only."""
    if not isinstance(choice, str):
        return _engines.get((choice, model), lambda: choice(model))
    return _engines.get((choice, model, str(version or "")),
                        lambda: _builtin(choice, "engine")(model, str(version or "")))


def reference_engine(choice: str | Callable[[str], Engine], model: str,
                     version: str = "") -> Engine:
    """The (cached, per process) engine that recomputes rows for shadow validation: the
    fallback's, except where a built-in has a lighter one (``"cpu"``: one onnxruntime thread,
    see :func:`coffea_sonic.engines.reference_engine`)."""
    if isinstance(choice, str) and "reference" in BUILTIN.get(choice, {}):
        return _engines.get((choice, model, str(version or ""), "reference"),
                            lambda: _builtin(choice, "reference")(model, str(version or "")))
    return fallback_engine(choice, model, version)


def submit(function: Callable[[], Any]) -> Future:
    """Run ``function`` on this process's fallback thread (never on a gRPC callback thread)."""
    executor = _executors.get("fallback", lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="coffea-sonic-fallback"))
    return executor.submit(function)


def warn_fallback(model: str, rows: int | None, reason: str) -> None:
    """WARNING for the first fallback of ``model`` in this process, then at most every 30 s.
    ``rows``: those about to run in-process (None when no server could even describe the model:
    then every call of this process runs in-process)."""
    now = time.monotonic()
    last = _last_warning.peek(model)
    if last is None or now - last > 30.0:
        _last_warning.set(model, now)
        what = "its calls" if rows is None else f"{rows} rows"
        logger.warning("coffea-sonic: FALLBACK: running %s in-process (%s) because no server can "
                       "serve it (%s)", model, what, reason)


def _builtin(choice: str, what: str) -> Callable[[str], Any]:
    module, _, name = BUILTIN[choice][what].partition(":")
    return getattr(importlib.import_module(module), name)


def declared_info(choice: str | Callable[[str], Engine] | None, model: str) -> Any:
    """What ``model`` declares when no server can say (the zoo's declaration), or None.

    Used when no server can describe the model but a fallback can still run it; a custom
    factory's engine may declare it as ``engine.info`` (a ModelInfo) instead.
    """
    if choice is None:
        return None
    if not isinstance(choice, str):
        declared = getattr(fallback_engine(choice, model), "info", None)
        if declared is not None:
            return declared
        choice = "cpu"
    return _builtin(choice, "info")(model)
