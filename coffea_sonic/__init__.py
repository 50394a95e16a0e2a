"""coffea-sonic: SONIC-style inference as a service for columnar HEP analysis.

A coffea processor declares Triton models by URL and gets aligned awkward outputs back. The
public names (docs/api.md) are imported lazily (docs/internals/client.md).

>>> import coffea_sonic
>>> coffea_sonic.__version__
'0.1.0'
>>> [name for name in ("TritonModel", "SonicMixin", "make_cluster") if name in coffea_sonic.__all__]
['TritonModel', 'SonicMixin', 'make_cluster']
"""

from __future__ import annotations

import os

from .lazy import lazy_exports

# Worker processes forked from a driver that already talked to a server (coffea's FuturesExecutor,
# multiprocessing) may use gRPC in the child only with gRPC's fork handlers on; grpc reads this
# once, at its import, so it is set before anything here imports grpc. A user's own value wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")

__version__ = "0.1.0"

# What an analysis uses, public name -> module that defines it. Everything else lives in its
# submodule: transports (coffea_sonic.transport), in-process engines (coffea_sonic.engines),
# column helpers (coffea_sonic.columns), sample data and the zoo's training (coffea_sonic.data,
# coffea_sonic.zoo), test gateways (coffea_sonic.facility.gateway), types (coffea_sonic.core,
# coffea_sonic.stats).
_EXPORTS: dict[str, str] = {
    # the client and the processor glue
    "TritonModel": "coffea_sonic.model",
    "SonicMixin": "coffea_sonic.processor",
    "RetryPolicy": "coffea_sonic.routing",
    "Secret": "coffea_sonic.core",
    "InferenceStats": "coffea_sonic.stats",
    # the column helpers a processor builds its inputs with (a module)
    "columns": "coffea_sonic.columns",
    # a real Triton server on this machine
    "LocalTritonServer": "coffea_sonic.server",
    # the facility: workers, checks
    "make_cluster": "coffea_sonic.facility.cluster",
    "check_servers": "coffea_sonic.facility.check",
    # errors: every class the client API or the CLI raises (TransportError never leaves the
    # client: it becomes one of these)
    "SonicError": "coffea_sonic.errors",
    "ConfigurationError": "coffea_sonic.errors",
    "InputValidationError": "coffea_sonic.errors",
    "ServerStartError": "coffea_sonic.errors",
    "ModelNotFoundError": "coffea_sonic.errors",
    "ServerUnavailableError": "coffea_sonic.errors",
    "InferenceError": "coffea_sonic.errors",
    "MissingDependencyError": "coffea_sonic.errors",
    "ClusterStartError": "coffea_sonic.errors",
    "PreflightError": "coffea_sonic.errors",
    "UnservableModelError": "coffea_sonic.errors",
    "AuthenticationError": "coffea_sonic.errors",
    "QuotaExceededError": "coffea_sonic.errors",
    "NetworkLabError": "coffea_sonic.errors",
    "ShadowDivergenceError": "coffea_sonic.shadow",
    "InconsistentVersionsError": "coffea_sonic.provenance",
}

# Names once at the top level that live in their submodules now: importing them from here still
# works and warns with the new place, for one release.
_MOVED: dict[str, str] = {
    "YieldGate": "coffea_sonic.share",
    "TlsOptions": "coffea_sonic.core",
    "deliver_settings": "coffea_sonic.facility.cluster",
    "setting": "coffea_sonic.config",
    "effective_settings": "coffea_sonic.config",
    "model_urls": "coffea_sonic.config",
    "configured_models": "coffea_sonic.config",
    "configured_servers": "coffea_sonic.config",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals(), also=["__version__"],
                                    moved=_MOVED)
