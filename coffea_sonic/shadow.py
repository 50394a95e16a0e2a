"""Shadow validation: recompute a fraction of the served rows in-process and compare.

How it works, the actions and the default tolerances, with examples: docs/internals/shadow.md.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from . import config
from . import fallback as fallback_module
from .core.process_local import ProcessLocal
from .dispatch import CallHooks, PieceAnswer
from .errors import ConfigurationError, InferenceError, MissingDependencyError

__all__ = ["DEFAULT_TOLERANCE", "ShadowAction", "ShadowDivergenceError", "ShadowHook",
           "divergence", "resolve_shadow", "shadow_hook", "tolerance_for"]

logger = logging.getLogger(__name__)

ShadowAction = Literal["raise", "quarantine"]
#: Tolerance on :func:`divergence` by where the server runs the model (docs/internals/shadow.md).
DEFAULT_TOLERANCE: dict[str, float] = {"cpu": 1e-4, "gpu": 1e-4}
_NOT_SHADOWED = ("fallback engine", "hook")
_executors: ProcessLocal[str, ThreadPoolExecutor] = ProcessLocal("shadow thread")


class ShadowDivergenceError(InferenceError):
    """A server's answers differ from the in-process reference beyond the tolerance."""


def divergence(served: np.ndarray, reference: np.ndarray) -> float:
    """Largest ``|served - reference| / max(1, |reference|)`` (0 for empty arrays)."""
    served = np.asarray(served, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if served.size == 0:
        return 0.0
    scale = np.maximum(1.0, np.abs(reference))
    return float(np.max(np.abs(served - reference) / scale))


def tolerance_for(*, gpu: bool) -> float:
    """The default tolerance of a model the server runs on a GPU or on the CPU."""
    return DEFAULT_TOLERANCE["gpu" if gpu else "cpu"]


def resolve_shadow(fraction: float | str | None) -> float:
    """The shadow fraction: ``fraction``, else the setting ``shadow`` (default 0: off)."""
    if fraction is None:
        fraction = config.setting("shadow", 0.0)
    try:
        value = float(fraction or 0.0)
    except (TypeError, ValueError):
        raise ConfigurationError(f"shadow must be a fraction of rows between 0 and 1, not "
                                 f"{fraction!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"shadow must be a fraction of rows between 0 and 1, not {value}")
    return value


@dataclass
class Divergence:
    """What one server's answers of one output looked like against the reference."""

    rows: int = 0
    largest: float = 0.0
    alarms: int = 0


class ShadowHook(CallHooks):
    """Recomputes ``fraction`` of the rows of every served answer (docs/internals/shadow.md)."""

    def __init__(self, fraction: float, *, tolerance: float | None = None,
                 action: ShadowAction = "raise", reference: Any = None) -> None:
        if action not in ("raise", "quarantine"):
            raise ConfigurationError(f"shadow_action must be 'raise' or 'quarantine', not {action!r}")
        if tolerance is not None and tolerance <= 0:
            raise ConfigurationError(f"shadow_tolerance must be > 0, not {tolerance}")
        self.fraction, self.tolerance, self.action = float(fraction), tolerance, action
        #: the reference engine's factory (a fallback choice); None: "cpu"
        self.reference = reference
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        self._pending: list[Future] = []
        self._error: ShadowDivergenceError | MissingDependencyError | None = None
        #: (server, output) -> Divergence
        self.divergences: dict[tuple[str, str], Divergence] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "tolerance": self.tolerance, "action": self.action,
                "reference": self.reference}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # -- hooks ------------------------------------------------------------------------------------

    def on_call(self, call: Any) -> None:
        if self._error is not None:
            raise self._error

    def on_answer(self, answer: PieceAnswer) -> None:
        call = answer.piece.call
        if answer.source in _NOT_SHADOWED or call.ragged is not None or not call.arrays:
            return
        rows = answer.piece.rows
        with self._lock:
            count = int(self._rng.binomial(rows, self.fraction))
            if count == 0:
                return
            picked = np.sort(self._rng.choice(rows, size=count, replace=False))
        start = answer.piece.start
        inputs = {name: np.ascontiguousarray(array[start:start + rows][picked])
                  for name, array in call.arrays.items()}
        served = {name: np.array(np.asarray(value)[:rows][picked])
                  for name, value in answer.outputs.items()}
        endpoint = answer.piece.endpoint
        gpu = bool(call.info.gpu)
        future = _executor().submit(self._compare, answer.model, answer.source, answer.version,
                                    inputs, served, gpu, endpoint, call.runtime)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [future]

    # -- the comparison, on the shadow thread -----------------------------------------------------

    def _engine(self, model: str, version: str = "") -> Any:
        choice = self.reference or "cpu"
        try:
            return fallback_module.reference_engine(choice, model, version)
        except MissingDependencyError:
            raise
        except ImportError as error:
            raise MissingDependencyError(
                f"shadow validation of {model!r} runs the reference engine in-process and it "
                f"needs {error.name or 'a missing package'}: pip install 'coffea-sonic[onnx]' "
                "(onnxruntime), or pass a reference/fallback factory") from error

    def _compare(self, model: str, source: str, version: str, inputs: dict[str, np.ndarray],
                 served: dict[str, np.ndarray], gpu: bool, endpoint: Any, runtime: Any) -> None:
        started = time.perf_counter()
        try:
            reference = self._engine(model, version)(inputs)
            limit = self.tolerance or tolerance_for(gpu=gpu)
            rows = len(next(iter(inputs.values())))
            alarms = []
            with self._lock:
                for name, value in served.items():
                    if name not in reference:
                        continue
                    found = divergence(value, np.asarray(reference[name]).reshape(value.shape))
                    record = self.divergences.setdefault((source, name), Divergence())
                    record.rows += rows
                    record.largest = max(record.largest, found)
                    if found > limit:
                        record.alarms += 1
                        alarms.append((name, found))
            if alarms:  # acted on before counted: a caller that sees the count sees the alarm
                self._alarm(model, source, version, alarms, limit, endpoint, runtime)
            runtime.count(shadow_rows=rows, shadow_alarms=len(alarms))
            self._publish(model)
            runtime.count(shadow_s=time.perf_counter() - started)
        except Exception as error:  # noqa: BLE001 - a broken reference must be seen, not hidden
            with self._lock:
                self._error = self._error or (
                    error if isinstance(error, (ShadowDivergenceError, MissingDependencyError))
                    else ShadowDivergenceError(
                        f"shadow validation of model {model!r} could not compare answers of "
                        f"{source}: {type(error).__name__}: {error}"))

    def _publish(self, model: str) -> None:
        """Write the report where ``monitor --shadow DIR`` reads it (setting ``shadow_dir``)."""
        folder = config.setting("shadow_dir", None)
        if not folder:
            return
        path = Path(folder) / f"{socket.gethostname()}-{os.getpid()}-{model}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps({"model": model, "report": self.report()}))
            temporary.replace(path)
        except OSError as error:  # the report is extra: never fail inference for it
            logger.info("coffea-sonic: could not write the shadow report %s: %s", path, error)

    def _alarm(self, model: str, source: str, version: str, alarms: list[tuple[str, float]],
               limit: float, endpoint: Any, runtime: Any) -> None:
        what = ", ".join(f"output {name!r} diverges by {found:.3g}" for name, found in alarms)
        message = (f"shadow validation: model {model!r} version {version or '?'} at {source}: "
                   f"{what} from the in-process reference (tolerance {limit:g}); the served model "
                   "is not the one the reference runs (a wrong conversion or another model)")
        if self.action == "quarantine" and endpoint is not None:
            logger.error("coffea-sonic: %s; quarantining %s", message, source)
            runtime.router.mark_failed(endpoint, message)
            return
        with self._lock:
            self._error = self._error or ShadowDivergenceError(message)

    # -- results ----------------------------------------------------------------------------------

    def drain(self, timeout_s: float = 60.0) -> None:
        """Wait for the comparisons started so far; raise a divergence found (action "raise")."""
        with self._lock:
            pending = list(self._pending)
        wait(pending, timeout=timeout_s)
        if self._error is not None:
            raise self._error

    def report(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{server: {output: {"rows", "largest", "alarms"}}}`` so far."""
        with self._lock:
            found: dict[str, dict[str, dict[str, float]]] = {}
            for (server, output), record in sorted(self.divergences.items()):
                found.setdefault(server, {})[output] = {
                    "rows": record.rows, "largest": record.largest, "alarms": record.alarms}
            return found


def shadow_hook(model: Any) -> ShadowHook | None:
    """The :class:`ShadowHook` of a ``TritonModel`` (None when shadow validation is off)."""
    return next((hook for hook in model.call_hooks if isinstance(hook, ShadowHook)), None)


def _executor() -> ThreadPoolExecutor:
    return _executors.get("shadow", lambda: ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="coffea-sonic-shadow"))
