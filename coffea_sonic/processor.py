"""``SonicMixin``: Triton inference as a service inside a coffea processor.

How to use it, with examples: docs/user/processor.md; what it adds under ``processor.Runner``
(the preflight, incidents, the run's report): docs/user/failures.md, docs/internals/incidents.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
from typing import Any, Callable, ClassVar, Mapping, Sequence

import awkward as ak
import numpy as np

from . import columns, config, incidents, preflight, repeats, run_report, tracing
from .errors import ConfigurationError, InputValidationError
from .provenance import Provenance, ProvenanceHook
from .run_report import SonicStats
from .shadow import shadow_hook
from .stats import InferenceStats

logger = logging.getLogger(__name__)

__all__ = ["SonicMixin", "SonicResult"]

Inputs = Mapping[str, Any]


def _is_dask_collection(value: Any) -> bool:
    return type(value).__module__.startswith("dask_awkward")


class SonicResult:
    """Handle of a request in flight; :meth:`result` gives the outputs, realigned if jagged.

    >>> SonicResult(None, None, done_outputs={"y": np.zeros(2)}).result()["y"].shape
    (2,)
    """

    def __init__(self, handle: Any, counts: Any, *, done_outputs: Mapping[str, Any] | None = None,
                 on_done: Callable[[], None] | None = None,
                 realign: Callable[[dict[str, np.ndarray]], dict[str, Any]] | None = None) -> None:
        self._handle = handle
        self._outputs = dict(done_outputs) if done_outputs is not None else None
        self._on_done = on_done
        #: turns the model's rows into the outputs (default: unflatten every output by counts)
        self._realign = realign or (functools.partial(columns.unflatten, counts=counts)
                                    if counts is not None else None)

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the outputs are there: numpy rows, or awkward arrays aligned with ``like``."""
        if self._outputs is None:
            rows = self._handle.result(timeout)
            self._outputs = self._realign(rows) if self._realign is not None else rows
            if self._on_done is not None:
                self._on_done()
        return self._outputs

    def done(self) -> bool:
        return self._outputs is not None or bool(self._handle is None or self._handle.done())


class SonicMixin:
    """Mixin for ``coffea.processor.ProcessorABC``: declared Triton models, ``self.infer``, stats.

    Class attributes (or the ``sonic_configure`` call in ``__init__``):

    ``sonic_models``
        ``{name: url or [urls]}``; ``name`` is how ``process`` refers to the model.
    ``sonic_options``
        keyword arguments for every :class:`~coffea_sonic.model.TritonModel` (``timeout_s``,
        ``max_in_flight``, ``ssl``, ``headers``, ...).
    ``sonic_inputs``
        optional ``{name: {tensor: (dtype, per-row dims)}}``: what ``process`` sends each model,
        checked against the served model before the run (``-1``: any size).
    ``sonic_preflight``
        False skips the check before the run (:mod:`coffea_sonic.preflight`).
    ``sonic_optional``
        names of declared models a run may never call (e.g. only where the files have the
        branches they need): the check before the run only warns where they are not served.
    ``sonic_repeats``
        False sends every call of a chunk, even one identical to an earlier call of the same
        chunk (by default those get the earlier answer, :mod:`coffea_sonic.repeats`).
    """

    sonic_models: ClassVar[Mapping[str, str | Sequence[str]]] = {}
    sonic_options: ClassVar[Mapping[str, Any]] = {}
    sonic_inputs: ClassVar[Mapping[str, Mapping[str, tuple[Any, tuple[int, ...]]]]] = {}
    sonic_preflight: ClassVar[bool] = True
    sonic_optional: ClassVar[frozenset[str]] = frozenset()
    sonic_repeats: ClassVar[bool] = True
    #: answers from two versions of one model fail the run instead of warning (see
    #: :meth:`sonic_provenance`)
    sonic_require_consistent_versions: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # a processor's own process/postprocess, wrapped so each chunk's incidents name it and
        # the run's report is written when postprocess is done
        for name, wrap in (("process", _chunk_recorded), ("postprocess", _run_reported)):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "_sonic_wrapped", False):
                setattr(cls, name, wrap(method))

    # -- configuration ---------------------------------------------------------------------
    def sonic_configure(self, models: Mapping[str, str | Sequence[str]] | None = None,
                        **options: Any) -> None:
        """Override the declared models and/or TritonModel options for this instance.

        >>> class P(SonicMixin):
        ...     sonic_models = {"jet_tagger": "triton+grpc://localhost:8001/jet_tagger"}
        >>> p = P(); p.sonic_configure({"jet_tagger": "triton+grpc://gpu1:8001/jet_tagger"})
        >>> p.sonic_model_urls()["jet_tagger"]
        ['triton+grpc://gpu1:8001/jet_tagger']
        """
        if models is not None:
            self.sonic_models = dict(models)
        if options:
            self.sonic_options = {**self.sonic_options, **options}

    def sonic_model_urls(self) -> dict[str, list[str]]:
        """Where each declared model is requested from, after run-time overrides (env, Dask config)."""
        return {name: config.model_urls(name, declared) for name, declared in self.sonic_models.items()}

    def sonic_model(self, name: str):
        """The :class:`~coffea_sonic.model.TritonModel` for declared model ``name`` (made on first use)."""
        from .model import TritonModel

        clients = self.__dict__.setdefault("_sonic_clients", {})
        client = clients.get(name)
        if client is None:
            if name not in self.sonic_models:
                raise ConfigurationError(
                    f"model {name!r} is not declared by {type(self).__name__}; declared: "
                    f"{sorted(self.sonic_models)}. Add it to sonic_models = {{name: url}}")
            urls = config.model_urls(name, self.sonic_models[name])
            target = urls[0] if len(urls) == 1 else urls
            client = TritonModel(target, **dict(self.sonic_options))
            hook = ProvenanceHook(self.sonic_require_consistent_versions)
            client.call_hooks = (*client.call_hooks, hook)
            self.__dict__.setdefault("_sonic_provenance", {})[name] = hook
            clients[name] = client
            self.__dict__.setdefault("_sonic_baseline", {})[name] = client.stats.copy()
        return client

    # -- inference -------------------------------------------------------------------------
    def _prepare(self, name: str, inputs: Inputs, like: Any) -> tuple[dict[str, np.ndarray], Any, bool]:
        """numpy rows per input, the counts to realign outputs with, and whether it is a meta pass."""
        if not isinstance(inputs, Mapping) or not inputs:
            raise InputValidationError(
                f"model {name!r}: inputs must be a non-empty dict tensor name -> array, "
                f"got {type(inputs).__name__}")
        if any(_is_dask_collection(v) for v in inputs.values()) or _is_dask_collection(like):
            raise InputValidationError(
                f"model {name!r}: got dask-awkward collections; wrap the per-chunk work in "
                "self.sonic_map(function, *collections) so inference runs per partition on the "
                "workers, not while the graph is built")
        rows: dict[str, np.ndarray] = {}
        counts = None
        meta_pass = False
        for tensor, value in inputs.items():
            if isinstance(value, np.ndarray):
                rows[tensor] = value
                continue
            array = value if isinstance(value, ak.Array) else ak.Array(value)
            meta_pass = meta_pass or columns.is_typetracer(array)
            flat, tensor_counts = columns.flatten(array)
            rows[tensor] = flat
            if isinstance(tensor_counts, tuple) and not tensor_counts:
                continue  # already flat
            if counts is None:
                counts = tensor_counts
            elif not meta_pass and not _same_counts(counts, tensor_counts):
                raise InputValidationError(
                    f"model {name!r}: input {tensor!r} is jagged differently from the other inputs; "
                    "all inputs of one call must describe the same objects")
        if like is not None:
            meta_pass = meta_pass or columns.is_typetracer(like)
            like_counts = columns.jagged_counts(like)
            if counts is not None and not meta_pass and not _same_counts(counts, like_counts):
                raise InputValidationError(f"model {name!r}: `like` is jagged differently from the inputs")
            counts = like_counts
        return rows, counts, meta_pass

    def _meta_outputs(self, name: str, counts: Any) -> dict[str, Any]:
        """Zero-row outputs of the right trailing shape and dtype (no inference request)."""
        info = self.sonic_model(name).info
        rows = {tensor.name: np.empty((0, *tensor.dims), dtype=tensor.dtype)
                for tensor in info.outputs}
        return columns.unflatten(rows, counts) if counts is not None else rows

    def infer_async(self, name: str, inputs: Inputs, *, like: Any = None,
                    ragged: bool = False) -> SonicResult:
        """Send the request now and return a handle; call ``.result()`` when the outputs are needed.

        ``inputs`` maps tensor names to numpy arrays or (jagged) awkward arrays; ``like`` is a
        jagged array whose structure numpy inputs/outputs follow (e.g. ``events.Jet`` for rows
        from :func:`coffea_sonic.columns.jet_features`).

        ``ragged=True`` (a model declaring ragged inputs, :mod:`coffea_sonic.ragged`): the
        innermost lists (an event's hits, a jet's constituents) go unpadded, many per request,
        with their counts; per-object outputs come back jagged like the inputs
        (``[events][hits]``), per-list outputs with one entry per list (numpy ``[events, ...]``
        for ``[events][hits]`` inputs, ``[events][jets]`` for ``[events][jets][constituents]``).
        """
        rows, counts, meta_pass = self._prepare(name, inputs, like)
        key = None if meta_pass else repeats.key_of(name, rows, counts, ragged)
        earlier = repeats.recall(key)
        if earlier is not None:  # an identical call of this chunk (a weight-only variation)
            stats = self.sonic_model(name).stats
            stats.repeat_calls += 1
            stats.repeat_rows += len(next(iter(rows.values()))) if rows else 0
            return SonicResult(earlier, None, realign=_copied)
        # every request of this chunk, of every model, carries the chunk's trace id
        with self._sonic_chunk_trace(like if like is not None else next(iter(inputs.values()))):
            if ragged:
                result = self._infer_ragged(name, rows, counts, meta_pass)
            elif meta_pass:
                return SonicResult(None, None, done_outputs=self._meta_outputs(name, counts))
            else:
                result = SonicResult(self.sonic_model(name).infer_async(rows), counts)
        if key is None:
            return result
        repeats.remember(key, result)  # kept as it came; every caller gets its own copy
        return SonicResult(result, None, realign=_copied)

    def _sonic_chunk_trace(self, array: Any) -> contextlib.AbstractContextManager:
        """:func:`coffea_sonic.tracing.chunk_trace` for the chunk ``array`` belongs to (a null
        context where the array says nothing of its chunk)."""
        label = chunk_label(array)
        if label is None:
            return contextlib.nullcontext()
        run = self.__dict__.setdefault("_sonic_run", secrets.token_hex(8))
        return tracing.chunk_trace(label, run=run)

    def _infer_ragged(self, name: str, rows: dict[str, np.ndarray], counts: Any,
                      meta_pass: bool) -> SonicResult:
        if counts is None:
            raise InputValidationError(
                f"model {name!r}: ragged=True needs jagged inputs (e.g. hits [events][hits][3]) "
                "or like= a jagged array whose innermost lists the rows fill")
        levels = counts if isinstance(counts, tuple) else (counts,)
        outer = levels[:-1] if len(levels) > 2 else (levels[0] if len(levels) == 2 else None)
        model = self.sonic_model(name)
        per_object = set(model.info.ragged_outputs)

        def realign(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
            return {output: (columns.unflatten(array, counts) if output in per_object
                             else columns.unflatten(array, outer) if outer is not None else array)
                    for output, array in outputs.items()}

        if meta_pass:
            info = model.info
            empty = {t.name: np.empty((0, *(max(d, 0) for d in t.dims[
                1 if t.name in per_object else 0:])), dtype=t.dtype) for t in info.outputs}
            return SonicResult(None, None, done_outputs=realign(empty))
        handle = model.infer_async(rows, counts=np.asarray(levels[-1]))
        return SonicResult(handle, counts, realign=realign)

    def infer(self, name: str, inputs: Inputs, *, like: Any = None,
              ragged: bool = False) -> dict[str, Any]:
        """Run model ``name`` on ``inputs`` and wait: outputs aligned with the inputs (or ``like``).

        On a server held in memory (:class:`~coffea_sonic.transport.memory.MemoryTransport`):

        >>> from coffea_sonic.core.tensors import ModelInfo, TensorInfo
        >>> from coffea_sonic.transport.memory import MemoryTransport
        >>> info = ModelInfo("double", ("1",), "python", 1024, (TensorInfo("x", "FP32", (2,)),),
        ...                  (TensorInfo("y", "FP32", (2,)),))
        >>> server = MemoryTransport({"double": (info, lambda inputs: {"y": inputs["x"] * 2})},
        ...                          address="memory:1")
        >>> class P(SonicMixin):
        ...     sonic_models = {"double": "triton+grpc://memory:1/double"}
        ...     sonic_options = {"transport": lambda settings: server}
        >>> P().infer("double", {"x": np.ones((3, 2), np.float32)})["y"].tolist()
        [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
        """
        return self.infer_async(name, inputs, like=like, ragged=ragged).result()

    def sonic_map(self, function: Callable[..., Any], *arrays: Any, label: str | None = None,
                  **kwargs: Any) -> Any:
        """Apply ``function(*arrays)`` per chunk: directly on concrete arrays, or as a
        ``dask_awkward.map_partitions`` node on dask-awkward collections.

        ``function`` may call ``self.infer``; during dask-awkward's meta pass it sees typetracers
        and no request is sent, so building the graph never runs an inference.
        """
        if not any(_is_dask_collection(array) for array in arrays):
            return function(*arrays, **kwargs)
        import dask_awkward as dak

        return dak.map_partitions(function, *arrays, label=label or getattr(function, "__name__", "sonic"),
                                  **kwargs)

    # -- statistics ------------------------------------------------------------------------
    def sonic_stats(self) -> SonicStats:
        """Client statistics per model since the previous call (put them in ``process``'s output).

        They add up under coffea's accumulator, so the final output holds the run's totals, and
        ``.incidents`` the run's record (:mod:`coffea_sonic.run_report`): this process' incidents
        since the previous call, including those of a chunk attempt coffea discarded.
        With shadow validation on, waits for this chunk's comparisons first and raises
        :class:`~coffea_sonic.shadow.ShadowDivergenceError` if a server diverged.
        """
        baselines = self.__dict__.setdefault("_sonic_baseline", {})
        collected: dict[str, InferenceStats] = {}
        for client in self.__dict__.get("_sonic_clients", {}).values():
            hook = shadow_hook(client)
            if hook is not None:  # the chunk's comparisons count here, and a divergence fails it
                hook.drain()
        for name, client in self.__dict__.get("_sonic_clients", {}).items():
            now = client.stats.copy()
            collected[name] = now - baselines.get(name, InferenceStats())
            baselines[name] = now
        return SonicStats(collected, incidents.take())

    def sonic_provenance(self) -> Provenance:
        """What answered this process' rows since the previous call: per model, server (or the
        fallback), version and config digest, the rows (:class:`~coffea_sonic.provenance.Provenance`;
        put it in ``process``'s output, coffea sums it over chunks). Two versions of one model
        warn, or raise with ``sonic_require_consistent_versions = True``."""
        total = Provenance(require_consistent_versions=self.sonic_require_consistent_versions)
        for hook in self.__dict__.get("_sonic_provenance", {}).values():
            total += hook.take()
        return total

    def sonic_check(self) -> None:
        """Check every declared model against its servers now (what the preflight does before a
        run; :mod:`coffea_sonic.preflight`); raises :class:`~coffea_sonic.errors.PreflightError`."""
        clients = {name: self.sonic_model(name) for name in self.sonic_models}
        for name, client in clients.items():
            preflight.check_model(name, client, self.sonic_inputs.get(name),
                                  optional=name in self.sonic_optional)

    # -- pickling --------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # the run's id goes with the processor: a chunk has one trace id on every worker
        run = self.__dict__.setdefault("_sonic_run", secrets.token_hex(8))
        if (not self.__dict__.get("_sonic_checked") and preflight.wanted(self)
                and preflight.called_by_coffea()):
            self.sonic_check()  # coffea's Runner ships the processor: its run starts next
            self.__dict__["_sonic_checked"] = True
        # where workers also write their incidents (read back by postprocess on this machine)
        self.__dict__.setdefault("_sonic_journal", run_report.journal_folder(run))
        state = self.__dict__.copy()
        # Clients are cheap to remake and hold per-process state; workers build their own.
        for key in ("_sonic_clients", "_sonic_baseline", "_sonic_provenance"):
            state.pop(key, None)
        return state


def _copied(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """A repeated call's outputs: numpy arrays copied (a caller may change its own in place),
    awkward arrays (immutable) shared."""
    return {name: value.copy() if isinstance(value, np.ndarray) else value
            for name, value in outputs.items()}


def _chunk_recorded(process: Callable[..., Any]) -> Callable[..., Any]:
    """``process`` run with its chunk named for the incidents it causes; a chunk attempt that
    fails is recorded (coffea throws its output away) before its error goes on."""

    @functools.wraps(process)
    def recorded(self: Any, events: Any, *args: Any, **kwargs: Any) -> Any:
        if incidents.current_chunk():  # an outer (subclass') wrapper already named the chunk
            return process(self, events, *args, **kwargs)
        incidents.set_journal(self.__dict__.get("_sonic_journal"))
        label = chunk_label(events) or "(chunk)"
        with incidents.chunk_context(label), repeats.chunk_memo(getattr(self, "sonic_repeats",
                                                                        True)):
            try:
                return process(self, events, *args, **kwargs)
            except Exception as error:
                first_line = (str(error).strip().splitlines() or [""])[0]
                incidents.record("failed_attempt", chunk=label,
                                 detail=f"{type(error).__name__}: {first_line}")
                incidents.flush()
                raise

    recorded._sonic_wrapped = True  # type: ignore[attr-defined]
    return recorded


def _run_reported(postprocess: Callable[..., Any]) -> Callable[..., Any]:
    """``postprocess`` followed by the run's report (once, by the outermost wrapper); the next
    run of the same processor gets a new run id and is checked again."""

    @functools.wraps(postprocess)
    def reported(self: Any, accumulator: Any, *args: Any, **kwargs: Any) -> Any:
        depth = self.__dict__.get("_sonic_postprocess_depth", 0)
        self.__dict__["_sonic_postprocess_depth"] = depth + 1
        try:
            result = postprocess(self, accumulator, *args, **kwargs)
        finally:
            self.__dict__["_sonic_postprocess_depth"] = depth
        if depth == 0:
            run = self.__dict__.get("_sonic_run") or secrets.token_hex(8)
            try:
                run_report.finish_run(run, accumulator if result is None else result)
            except Exception:  # noqa: BLE001 - the analysis' output matters more than its report
                logger.exception("coffea-sonic: the run report of run %s failed", run)
            for key in ("_sonic_run", "_sonic_journal", "_sonic_checked"):
                self.__dict__.pop(key, None)
        return result

    reported._sonic_wrapped = True  # type: ignore[attr-defined]
    return reported


def chunk_label(array: Any) -> str | None:
    """``dataset:file:start-stop`` of the coffea chunk that ``array`` (NanoEvents, or a collection
    of them) was read from, None if it does not say.

    >>> chunk_label(np.zeros(3)) is None
    True
    """
    try:
        events = array._events() if hasattr(array, "_events") else array
        metadata = getattr(events, "metadata", None)
    except Exception:  # noqa: BLE001 - anything not NanoEvents: no chunk
        return None
    if not isinstance(metadata, Mapping) or "entrystart" not in metadata:
        return None
    return (f"{metadata.get('dataset', '')}:{metadata.get('filename', '')}:"
            f"{metadata['entrystart']}-{metadata.get('entrystop', '')}")


def _same_counts(first: Any, second: Any) -> bool:
    first_levels = first if isinstance(first, tuple) else (first,)
    second_levels = second if isinstance(second, tuple) else (second,)
    return len(first_levels) == len(second_levels) and all(
        np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first_levels, second_levels))
