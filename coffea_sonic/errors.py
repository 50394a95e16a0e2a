"""Exception classes of coffea-sonic.

Every error the library raises on purpose derives from :class:`SonicError`, so a user can catch
them all at once; each message names what is wrong and what to do about it.

>>> from coffea_sonic.errors import SonicError, InputValidationError
>>> issubclass(InputValidationError, SonicError)
True
"""

from __future__ import annotations


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


class InferenceError(SonicError, RuntimeError):
    """A server answered, but the answer is wrong or an error that must not be retried."""


class MissingDependencyError(SonicError, ImportError):
    """An optional dependency (torch, nvidia-pytriton, dask-jobqueue) is needed but not installed."""


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
