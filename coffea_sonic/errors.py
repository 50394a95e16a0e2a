"""Exception classes of coffea-sonic.

Every error the library raises on purpose derives from :class:`SonicError`, so a user can catch
them all at once; each message names what is wrong and what to do about it.

>>> from coffea_sonic.errors import SonicError, InputValidationError
>>> issubclass(InputValidationError, SonicError)
True
"""

from __future__ import annotations

import importlib
from types import ModuleType


class SonicError(Exception):
    """Base class of every coffea-sonic error."""


class ConfigurationError(SonicError, ValueError):
    """A setting (URL, option, environment variable) is malformed or inconsistent."""


class InputValidationError(SonicError, ValueError):
    """Inputs do not match what the model declares (name, rank, dims or dtype)."""


class ServerStartError(SonicError, RuntimeError):
    """The embedded tritonserver did not become ready; the message carries its last log lines."""


class ModelNotFoundError(SonicError, LookupError):
    """The requested model (or version) is not known to the zoo or not served by any server."""


class ServerUnavailableError(SonicError, ConnectionError):
    """No server could serve the request (after retries, and without a fallback)."""


class AuthenticationError(ConfigurationError):
    """A server or gateway refused our credentials (missing, expired, wrong signature or audience).

    The message names the server and where the token came from (``env:NAME``, ``file:PATH``),
    never the token.
    """


class QuotaExceededError(ServerUnavailableError):
    """A gateway kept refusing requests over the user's quota (RESOURCE_EXHAUSTED) until the
    call's deadline; the message names the quota as the gateway stated it."""


class InferenceError(SonicError, RuntimeError):
    """A server answered, but the answer is wrong or an error that must not be retried."""


class MissingDependencyError(SonicError, ImportError):
    """An optional dependency (torch, nvidia-pytriton, dask-jobqueue) is needed but not installed."""


#: Which extra of coffea-sonic installs each optional module (``pip install 'coffea-sonic[EXTRA]'``).
EXTRAS = {"onnxruntime": "onnx", "onnx": "onnx", "torch": "torch", "pytriton": "server",
          "dask_jobqueue": "facility", "matplotlib": "bench", "tritonclient.http": "bench"}


def require(module: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``, or raise one :class:`MissingDependencyError` naming the extra.

    The core install (the client) leaves torch, onnxruntime, onnx, nvidia-pytriton and
    dask-jobqueue out; every feature that needs one of them imports it through here.

    >>> require("json", "reading JSON").__name__
    'json'
    >>> require("no_such_module", "the example")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.MissingDependencyError: the example needs no_such_module, ...: pip install no_such_module
    """
    top = module.split(".")[0]
    extra = EXTRAS.get(module, EXTRAS.get(top))
    try:
        return importlib.import_module(module)
    except ImportError as error:
        missing = error.name or ""
        if missing and not (module == missing or module.startswith(missing + ".")
                            or missing.startswith(top + ".")):
            raise  # the module is there but one of ITS dependencies is broken: show that
        where = f"pip install 'coffea-sonic[{extra}]'" if extra else f"pip install {top}"
        raise MissingDependencyError(
            f"{feature} needs {top}, which is not installed in this environment "
            f"({error}): {where}") from error


class PreflightError(SonicError, RuntimeError):
    """A processor's model failed the check made before its run started (not served, inputs that
    do not fit, a refused token, no server and no fallback): no chunk would have succeeded, so
    none was started. The message says what is wrong and what to do."""


class ClusterStartError(SonicError, RuntimeError):
    """A Dask cluster (local, batch jobs or a scheduler address) did not get its workers in time."""


class UnservableModelError(ConfigurationError, ServerStartError):
    """A model repository holds models the embedded server cannot run (refused before it starts).

    ``refusals`` lists ``(model, version, reason)``. Also a :class:`ServerStartError`, since the
    server was not started: code that handles a failed start handles this too.
    """

    def __init__(self, message: str, refusals: list | tuple = ()) -> None:
        super().__init__(message)
        self.refusals = list(refusals)


class NetworkLabError(SonicError, RuntimeError):
    """The lab of hosts on one machine (:mod:`coffea_sonic.netlab`) could not be built or driven
    (not root, no ``ip``/``tc``/``nsenter``, a process inside a host did not start)."""
