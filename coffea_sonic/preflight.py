"""The preflight: a processor's models checked once against the servers before its run starts.

What it checks, and how to turn it off: docs/user/failures.md, "The preflight" (which also holds
the example of :func:`check_declared_inputs`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Mapping

import numpy as np

from . import config
from .core.tensors import ModelInfo
from .errors import (AuthenticationError, ConfigurationError, InferenceError, ModelNotFoundError,
                     PreflightError, ServerUnavailableError, SonicError)

__all__ = ["called_by_coffea", "check_declared_inputs", "check_model", "wanted"]

logger = logging.getLogger(__name__)

_OFF = {"off", "false", "no", "0", "none"}
#: how the user turns the preflight off, quoted by every preflight error
TURN_OFF = "sonic_preflight = False on the processor, or COFFEA_SONIC_PREFLIGHT=off"


def wanted(processor: Any) -> bool:
    """Whether ``processor`` is to be checked (its ``sonic_preflight`` and the setting)."""
    if not getattr(processor, "sonic_preflight", True):
        return False
    return str(config.setting("preflight", "on")).strip().lower() not in _OFF


def called_by_coffea(depth: int = 60) -> bool:
    """Whether this is a coffea ``processor`` executor or Runner pickling the processor (its
    frames are on this thread's stack), rather than a user saving it."""
    frame = sys._getframe(1)
    for _ in range(depth):
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith("coffea.processor"):
            return True
        frame = frame.f_back
    return False


def _fail(problem: str, fix: str) -> PreflightError:
    return PreflightError(f"{problem}\n  what to do: {fix}\n  (checked before the run started; "
                          f"{TURN_OFF} skips this check)")


def check_model(name: str, model: Any, declared_inputs: Mapping[str, Any] | None,
                optional: bool = False) -> None:
    """Check one declared model through its client ``model`` (a TritonModel); raise
    :class:`PreflightError` on a problem that no retry would fix. An ``optional`` model (one a
    run may never call, ``sonic_optional``) that is not served or not reachable is only logged."""
    if not hasattr(model, "_get_runtime"):  # an in-process stand-in: no server to check
        return
    runtime = model._get_runtime()
    urls = ", ".join(model.urls)
    try:
        info, version = runtime.router.model_info(
            model.model_name, model.version, timeout_s=min(model.timeout_s,
                                                           model.connect_timeout_s),
            expected_checksum=model.expected_checksum, wait=False)
    except AuthenticationError as error:
        raise _fail(f"model {name!r}: {error}", "fix the token or certificate settings "
                    "(token_env, token_file, ca_file); `coffea-sonic check URL` shows "
                    "what the server accepts") from None
    except ModelNotFoundError as error:
        if optional:
            return _optional_missing(name, error)
        raise _fail(f"model {name!r} at {urls}: {error}",
                    "fix the model name or version in sonic_models, or serve it there") from None
    except ServerUnavailableError as error:
        if optional:
            return _optional_missing(name, error)
        if model.fallback is not None:
            logger.warning("coffea-sonic: preflight: model %r: no server reachable now; the run "
                           "starts and its calls fall back to %r until one answers (%s)", name,
                           model.fallback if isinstance(model.fallback, str) else "custom",
                           str(error)[:300])
            return
        why = "; ".join(f"{e.address}: {e.last_error[-160:]}" for e in runtime.router.endpoints
                        if e.last_error) or str(error)[-200:]
        raise _fail(f"model {name!r}: no server reachable at {urls} within connect_timeout_s "
                    f"{model.connect_timeout_s:g} s ({why})",
                    f"start the server (coffea-sonic serve) or fix the URL; `coffea-sonic check "
                    f"{model.url}` says why; fallback='cpu' runs the model in-process "
                    "instead") from None
    except (InferenceError, ConfigurationError) as error:
        raise _fail(f"model {name!r}: {error}", "deploy the model the analysis was written "
                    "for, or fix the processor's settings") from None
    except SonicError as error:  # anything else the client knows: said the same short way
        raise _fail(f"model {name!r}: {error}", "see the message above") from None
    check_declared_inputs(name, declared_inputs, info, version=version, servers=urls)


def _optional_missing(name: str, error: Exception) -> None:
    logger.warning("coffea-sonic: preflight: optional model %r cannot be served now; a chunk "
                   "that calls it will fail: %s", name, str(error)[:300])


def check_declared_inputs(name: str, declared: Mapping[str, Any] | None,
                          info: ModelInfo | None, version: str = "", servers: str = "") -> None:
    """Raise :class:`PreflightError` where ``declared`` (``{tensor: (dtype, per-row dims)}``,
    what ``process`` sends) does not fit ``info`` (what the server's model takes)."""
    if not declared or info is None:
        return
    served = {tensor.name: tensor for tensor in info.inputs}
    takes = ", ".join(f"{t.name} {t.datatype} {list(t.dims)}" for t in info.inputs)
    where = (f"model {name!r}" + (f" version {version}" if version else "")
             + (f" at {servers}" if servers else ""))
    unknown = sorted(set(declared) - set(served))
    missing = sorted(set(served) - set(declared))
    if unknown or missing:
        raise _fail(f"{where}: the processor sends inputs {sorted(declared)}, the model takes "
                    f"{takes}", "rename the tensors in process() and sonic_inputs to the "
                    "model's input names")
    for tensor_name, spec in declared.items():
        dtype, dims = spec
        tensor = served[tensor_name]
        sent = np.dtype(dtype)
        shape_ok = len(dims) == len(tensor.dims) and all(
            want < 0 or have < 0 or want == have for want, have in zip(tensor.dims, dims))
        dtype_ok = tensor.dtype == object or np.can_cast(sent, tensor.dtype, casting="safe")
        if not (shape_ok and dtype_ok):
            raise _fail(f"{where} input {tensor_name!r}: the processor sends {sent} "
                        f"{list(dims)} per row, the model takes {tensor.datatype} "
                        f"{list(tensor.dims)}", "fix the features in process() (and "
                        "sonic_inputs), or point sonic_models at the model they were made for")
