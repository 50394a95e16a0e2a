"""The Triton steps of ``coffea-sonic check``, run through the workers' own client.

What each step tells apart: docs/internals/facility.md, "The Triton steps".

>>> shm_cause("status call 2 of 8 did not find the probe region: a proxy or load balancer ...")
'proxy'
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..core.endpoint import ServerSettings
from ..core.tensors import ModelInfo
from ..core.tls import TlsOptions
from ..errors import ConfigurationError, ModelNotFoundError, SonicError
from ..model import TritonModel
from ..routing import RetryPolicy, Router, get_router
from ..transport.base import Transport
from ..transport.errors import TransportError
from .check_report import CheckOptions, ServedModel, ServerReport, Target

__all__ = ["SHM_CAUSES", "check_triton", "restriction_key", "shm_cause", "tiny_inputs",
           "worker_model"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Why shared memory is not used, by :attr:`ServerReport.shm_cause`.
SHM_CAUSES = {
    "remote": "the server is not on this host",
    "proxy": "a proxy or load balancer in front of it spreads requests over several servers",
    "restricted": "the server restricts its shared-memory protocol",
    "dev-shm": "the server cannot map this node's /dev/shm, or this node has none",
    "unreachable": "the server did not answer the probe",
    "not-asked": "the workers ask for transport='grpc' (the transport setting)",
    "http": "the URL uses Triton's HTTP API (shared memory is used with gRPC URLs only)",
    "usable": "",
}
_EXPECTED_HEADER = re.compile(r"expecting header '([^']+)'")
_GRPC_KEY_PREFIX = "triton-grpc-protocol-"
#: What workers do without each protocol group.
_WITHOUT = {
    "model-repository": "models are looked up one by one",
    "shared-memory": "tensors travel over gRPC",
    "statistics": "no server statistics (TritonModel.server_statistics, measure_server)",
}


def worker_model(target: Target, options: CheckOptions, tls: TlsOptions | None) -> TritonModel:
    """The TritonModel a worker would make for ``target`` (a placeholder model if none is named:
    no request ever names it; its settings and router are those of any model on that server)."""
    return TritonModel(
        target.model_url(tls=tls is not None), timeout_s=options.timeout_s,
        connect_timeout_s=options.timeout_s, ssl=tls, headers=options.headers(),
        protocol_key=options.protocol_key(), transport=options.transport, fallback="off",
        # one attempt: a check reports the first failure instead of retrying for two minutes
        retry=RetryPolicy(max_attempts=1, total_s=max(1.0, 2 * options.timeout_s)))


def restriction_key(error: TransportError) -> str:
    """The KEY a restricted server expects, from its refusal (``""`` if it does not say).

    >>> restriction_key(TransportError("restricted", "This protocol is restricted, expecting "
    ...                                "header 'triton-grpc-protocol-k'"))
    'k'
    """
    match = _EXPECTED_HEADER.search(error.detail)
    return match[1].removeprefix(_GRPC_KEY_PREFIX) if match else ""


def shm_cause(reason: str) -> str:
    """The :data:`SHM_CAUSES` key of a shared-memory probe's reason."""
    lowered = reason.lower()
    for fragment, cause in (("not on this host", "remote"), ("restricted", "restricted"),
                            ("proxy or load balancer", "proxy"), ("unreachable", "unreachable"),
                            ("did not answer", "unreachable")):
        if fragment in lowered:
            return cause
    return "dev-shm"


def tiny_inputs(info: ModelInfo) -> dict[str, np.ndarray]:
    """One row of zeros per input (variable dims as 1), as the model declares them.

    >>> from coffea_sonic.core.tensors import TensorInfo
    >>> info = ModelInfo("m", ("1",), "onnx", 8, (TensorInfo("x", "FP32", (-1, 3)),), ())
    >>> tiny_inputs(info)["x"].shape
    (1, 1, 3)
    """
    arrays = {}
    for tensor in info.inputs:
        shape = tuple(max(int(dim), 1) for dim in tensor.dims)
        if info.batching:
            shape = (1, *shape)
        arrays[tensor.name] = (np.full(shape, b"", dtype=object) if tensor.datatype == "BYTES"
                               else np.zeros(shape, dtype=tensor.dtype))
    return arrays


def _timed(call: Callable[[], T]) -> tuple[T, float]:
    started = time.perf_counter()
    value = call()
    return value, (time.perf_counter() - started) * 1e3


def _key_advice(key: str, configured: bool) -> str:
    if configured:
        return ("the configured protocol key was not accepted: check its name and value "
                "(--protocol-key-name/--protocol-key-env here; workers: the settings "
                "protocol_key_name and protocol_key_env)")
    name = key or "KEY"
    return (f"ask the facility for the key and pass it: --protocol-key-name {name} "
            f"--protocol-key-env NAME here; workers: TritonModel(protocol_key=('{name}', "
            "Secret.from_env('NAME'))) or the settings protocol_key_name / protocol_key_env")


# -- auth and server --------------------------------------------------------------------------------
def _health_failure(error: TransportError, report: ServerReport, options: CheckOptions,
                    settings: ServerSettings) -> None:
    sent_token = any(name == "authorization" for name, _ in settings.headers)
    text = error.describe()
    if error.kind == "unauthenticated":
        if sent_token:
            report.add("auth", "fail", f"the token from {options.token_source} was rejected "
                       f"({text})", "the token is wrong, expired or for another service: get a "
                       "fresh one from the facility and export it again")
        else:
            report.add("auth", "fail", f"the server (or its gateway) requires a token ({text})",
                       "export the facility's token in a variable and pass --token-env NAME "
                       "(Python: CheckOptions(token_env=NAME); workers: the setting token_env and "
                       "make_cluster(env=[NAME]))")
    elif error.kind == "restricted":
        report.add("auth", "fail", f"the server restricts its health API behind a key ({text})",
                   _key_advice(restriction_key(error), settings.protocol_key is not None))
    elif error.kind == "timeout":
        report.add("server", "fail", f"no answer within {options.timeout_s:.0f} s ({text})",
                   "the server is overloaded or hanging: check its load (coffea-sonic monitor) "
                   "or ask the facility")
    else:
        report.add("server", "fail", f"{settings.protocol} call failed: {text}",
                   "if TLS is involved, check --ca-file / the client certificate; otherwise the "
                   "server is not a healthy Triton: ask the facility")


def _check_health(control: Transport, settings: ServerSettings, options: CheckOptions,
                  report: ServerReport) -> float | None:
    """Auth and readiness; the first call's milliseconds (connect included), None on failure."""
    try:
        settings.metadata()  # secrets are read now: a missing variable is reported, not raised
    except ConfigurationError as error:
        report.add("auth", "fail", str(error),
                   "set it here and on the workers (make_cluster(env=[NAME]) forwards it by "
                   "name), or point --token-env / --protocol-key-env at the right variable")
        return None
    try:
        ready, first_ms = _timed(lambda: control.ready(options.timeout_s))
    except TransportError as error:
        _health_failure(error, report, options, settings)
        return None
    source = options.token_source
    sent_token = any(name == "authorization" for name, _ in settings.headers)
    report.add("auth", "ok", f"token from {source} accepted" if sent_token and source
               else "token accepted" if sent_token
               else "no token sent; the server did not ask for one")
    try:
        metadata = control.server_metadata(options.timeout_s)
        report.server_version = f"{metadata.get('name', '?')} {metadata.get('version', '?')}"
    except (TransportError, AttributeError) as error:
        report.server_version = "Triton (version not given)"
        logger.debug("server metadata of %s: %s", report.address, error)
    if ready:
        report.add("server", "ok", f"{report.server_version}: live and ready")
    else:
        report.add("server", "fail", f"{report.server_version}: live but not ready",
                   "the server is starting or a model failed to load: wait and retry, or ask "
                   "the facility to look at the server log")
    return first_ms


# -- access: restricted protocol groups -------------------------------------------------------------
def _repository(control: Transport, timeout_s: float) -> list[ServedModel]:
    """Every model version in the index with its state (gRPC: also those not ready, and why)."""
    rpc = getattr(control, "rpc", None)
    if rpc is not None:
        from tritonclient.grpc import service_pb2

        index = rpc("RepositoryIndex", service_pb2.RepositoryIndexRequest(ready=False), timeout_s)
        return sorted((ServedModel(entry.name, entry.version or "", entry.state or "UNKNOWN",
                                   entry.reason) for entry in index.models),
                      key=lambda m: (m.name, int(m.version) if m.version.isdigit() else 0))
    return [ServedModel(name, version, "READY")
            for name, versions in control.model_index(timeout_s).items() for version in versions]


def _check_access(control: Transport, target: Target, settings: ServerSettings,
                  options: CheckOptions, report: ServerReport) -> None:
    """Which of the groups the client uses refuse this client (kind ``restricted``)."""
    timeout = options.timeout_s
    calls: dict[str, Callable[[], Any]] = {
        "model-repository": lambda: _repository(control, timeout),
        # the named model's (over HTTP "" is no path: /v2/models//stats answers 404)
        "statistics": lambda: control.statistics(target.model, "", timeout),
    }
    rpc = getattr(control, "rpc", None)
    if rpc is not None:
        from tritonclient.grpc import service_pb2

        calls["shared-memory"] = lambda: rpc(
            "SystemSharedMemoryStatus", service_pb2.SystemSharedMemoryStatusRequest(), timeout)
    refusals: dict[str, TransportError] = {}
    for group, call in calls.items():
        try:
            answer = call()
        except TransportError as error:
            if error.kind == "restricted":
                refusals[group] = error
            else:
                logger.info("check %s: %s answered %s", report.address, group, error.describe())
            continue
        if group == "model-repository":
            report.models = answer
    report.restricted = sorted(refusals)
    keyed = settings.protocol_key is not None
    if not refusals:
        with_key = f" (with protocol key {settings.protocol_key[0]!r})" if keyed else ""
        report.add("access", "ok", f"open to this client{with_key}: {', '.join(calls)}")
        return
    first = next(iter(refusals.values()))
    header = _EXPECTED_HEADER.search(first.detail)
    expects = f" (it expects header {header[1]!r})" if header else ""
    consequences = "; ".join(_WITHOUT[group] for group in report.restricted)
    report.add("access", "warn",
               f"the server restricts {', '.join(report.restricted)}{expects}; inference, "
               f"metadata and health are open. Workers adapt: {consequences}",
               _key_advice(restriction_key(first), keyed))


# -- model ------------------------------------------------------------------------------------------
def _check_model(model: TritonModel, target: Target, report: ServerReport) -> ModelInfo | None:
    """The named model as the workers' router finds it; its info if it is served."""
    if not target.model:
        return None
    wanted = f"{target.model} version {target.version}" if target.version else target.model
    entries = [entry for entry in report.models if entry.name == target.model]
    try:
        info = model.info
        version = model.served_version
    except ModelNotFoundError as error:
        if report.models and not entries:
            listing = ", ".join(sorted({entry.name for entry in report.models}))
            report.add("model", "fail", f"{target.model!r} is not in the server's repository "
                       f"(it has: {listing})", "check the model name in your URL/config, or ask "
                       "the facility to load the model")
        elif entries:
            states = ", ".join(f"v{e.version or '?'} {e.state}" + (f": {e.reason}" if e.reason
                                                                     else "") for e in entries)
            report.add("model", "fail", f"{wanted} is not ready ({states})",
                       "drop the version from the URL to use the latest, or ask the facility to "
                       "load it (a failed load is explained in the server log)")
        else:
            report.add("model", "fail", f"{wanted} is not served: {error}",
                       "check the model name and version in your URL/config, or ask the facility "
                       "to load the model")
        return None
    except SonicError as error:
        report.add("model", "fail", f"{wanted}: {error}",
                   "the server answers but cannot describe the model: ask the facility to look "
                   "at the server log")
        return None
    versions = ", ".join(f"v{e.version} {e.state}" for e in entries) or (
        f"versions {', '.join(info.versions) or '?'} (from its metadata)")
    signature = "; ".join(f"{t.name} {t.datatype}{list(t.dims)}" for t in info.inputs)
    outputs = "; ".join(f"{t.name}{list(t.dims)}" for t in info.outputs)
    report.add("model", "ok", f"{target.model}: {versions}; inputs {signature} -> {outputs}; "
               f"max batch {info.max_batch_size}; requests name version {version or 'latest'}")
    return info


# -- latency and transport --------------------------------------------------------------------------
def _measure_latency(control: Transport, model: TritonModel, info: ModelInfo | None,
                     first_ms: float, options: CheckOptions, report: ServerReport) -> None:
    try:
        for _ in range(options.pings):
            report.health_ms.append(_timed(lambda: control.ready(options.timeout_s))[1])
    except TransportError as error:
        report.add("latency", "fail", f"a health call failed after {len(report.health_ms)}: "
                   f"{error.describe()}", "the server is unstable: ask the facility")
        return
    summary = (f"health {statistics.median(report.health_ms):.2f} ms median of {options.pings} "
               f"(first call incl. connect {first_ms:.1f} ms)" if report.health_ms
               else f"first health call incl. connect {first_ms:.1f} ms")
    if info is not None:
        inputs = tiny_inputs(info)
        try:
            for _ in range(max(1, options.pings)):
                report.inference_ms.append(_timed(lambda: model(inputs))[1])
        except SonicError as error:
            report.add("latency", "fail", summary + f"; a one-row inference failed: {error}",
                       "the model answers health calls but not requests: the workers would fail "
                       "the same way; ask the facility to look at the server log")
            return
        summary += (f"; inference of one {info.name} row "
                    f"{statistics.median(report.inference_ms):.2f} ms median of "
                    f"{len(report.inference_ms)} over {model.transport_kind}")
    report.add("latency", "ok", summary)


def _check_transport(model: TritonModel, router: Router, options: CheckOptions,
                     report: ServerReport) -> None:
    """What the workers' requests use, and why shared memory is not (the probe's reason)."""
    endpoint = router.endpoints[0]
    try:
        kind = model.transport_kind
    except SonicError as error:
        report.add("transport", "fail", str(error),
                   "use transport='auto' (the default) or 'grpc' (check: --transport)")
        return
    if kind in ("shm", "cuda") and endpoint.shm_off:  # a request met a region error: fell back
        kind = endpoint.settings.protocol
    report.transport = kind
    if kind in ("shm", "cuda"):
        from ..transport.shm import probe_shared_memory

        report.shm_usable, report.shm_cause = True, "usable"
        report.shm_reason = probe_shared_memory(router.control(endpoint))[1]
        memory = "CUDA shared memory" if kind == "cuda" else "system shared memory"
        not_cuda = (f"; the server runs it on a GPU, but CUDA memory is not used: "
                    f"{endpoint.cuda_off}" if kind == "shm" and endpoint.cuda_off
                    and model.info.gpu else "")
        report.add("transport", "ok", f"workers here send tensors through {memory} ({kind}): "
                   f"{report.shm_reason}{not_cuda}")
        return
    report.shm_usable = False
    if kind == "http" or endpoint.settings.protocol == "http":
        report.shm_cause, report.shm_reason = "http", SHM_CAUSES["http"]
    elif model.transport == "grpc":
        report.shm_cause, report.shm_reason = "not-asked", SHM_CAUSES["not-asked"]
    elif endpoint.shm_off:
        report.shm_cause, report.shm_reason = shm_cause(endpoint.shm_off), endpoint.shm_off
    else:
        report.shm_cause = "unreachable"
        report.shm_reason = f"undecided: the server is {endpoint.state()}"
    because = SHM_CAUSES[report.shm_cause]
    detail = f" ({report.shm_reason})" if report.shm_reason != because else ""
    status, advice = "ok", ""
    if report.shm_cause == "dev-shm":
        status = "warn"
        advice = ("for the faster path, give the server this node's /dev/shm (containers: "
                  "--ipc=host or -v /dev/shm:/dev/shm) and check that /dev/shm has room")
    report.add("transport", status, f"workers here send tensors over {kind}: shared memory is "
               f"not used: {because}{detail}", advice)


def check_triton(target: Target, options: CheckOptions, report: ServerReport,
                 tls: TlsOptions | None) -> None:
    """The Triton steps for a reachable target whose TLS setting matches."""
    try:
        model = worker_model(target, options, tls)
    except ConfigurationError as error:
        report.add("auth", "fail", str(error), "fix the option named above")
        return
    settings = model.servers[0]
    router = get_router(model.servers, policy=model.retry,
                        connect_timeout_s=model.connect_timeout_s, transport=model.transport)
    control = router.control(router.endpoints[0])
    first_ms = _check_health(control, settings, options, report)
    if first_ms is None or not report.ok:
        return
    _check_access(control, target, settings, options, report)
    info = _check_model(model, target, report)
    _measure_latency(control, model, info, first_ms, options, report)
    _check_transport(model, router, options, report)
