"""coffea-sonic: SONIC-style inference as a service for columnar HEP analysis.

A coffea processor declares Triton models by URL, sends awkward columns as batched, pipelined gRPC
requests per chunk, and gets aligned awkward outputs back; an embedded real Triton server, a model
zoo and in-process engines make it runnable anywhere.

>>> import coffea_sonic
>>> coffea_sonic.__version__
'0.1.0'

The public names below are imported lazily, so ``import coffea_sonic`` stays fast.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# Worker processes forked from a driver that already talked to a server (coffea's FuturesExecutor,
# multiprocessing) may use gRPC in the child only with gRPC's fork handlers on; grpc reads this
# once, at its import, so it is set before anything here imports grpc. A user's own value wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "SonicError": "coffea_sonic.errors",
    "ConfigurationError": "coffea_sonic.errors",
    "InputValidationError": "coffea_sonic.errors",
    "ServerStartError": "coffea_sonic.errors",
    "ModelNotFoundError": "coffea_sonic.errors",
    "ServerUnavailableError": "coffea_sonic.errors",
    "InferenceError": "coffea_sonic.errors",
    "MissingDependencyError": "coffea_sonic.errors",
    "LocalTritonServer": "coffea_sonic.server",
    "write_repository": "coffea_sonic.server",
    "CpuEngine": "coffea_sonic.engines",
    "GpuEngine": "coffea_sonic.engines",
    "TritonModel": "coffea_sonic.model",
    "SonicMixin": "coffea_sonic.processor",
    "RetryPolicy": "coffea_sonic.routing",
    "YieldGate": "coffea_sonic.share",
    "Secret": "coffea_sonic.core",
    "TlsOptions": "coffea_sonic.core",
    "ServerSettings": "coffea_sonic.core",
    "ModelInfo": "coffea_sonic.core",
    "TensorInfo": "coffea_sonic.core",
    "Transport": "coffea_sonic.transport",
    "TransportError": "coffea_sonic.transport",
    "InferRequest": "coffea_sonic.transport",
    "InferAnswer": "coffea_sonic.transport",
    "GrpcTransport": "coffea_sonic.transport.grpc",
    "MemoryTransport": "coffea_sonic.transport.memory",
    "InferenceStats": "coffea_sonic.stats",
    "ServerStatistics": "coffea_sonic.stats",
    "flatten": "coffea_sonic.columns",
    "unflatten": "coffea_sonic.columns",
    "jagged_counts": "coffea_sonic.columns",
    "jet_features": "coffea_sonic.columns",
    "jet_constituents": "coffea_sonic.columns",
    "pad_constituents": "coffea_sonic.columns",
    "write_sample": "coffea_sonic.data",
    "draw_labelled_jets": "coffea_sonic.data",
    "fetch_coffea_test_samples": "coffea_sonic.data",
    "train_jet_tagger": "coffea_sonic.zoo.train",
    "ClusterStartError": "coffea_sonic.errors",
    "UnservableModelError": "coffea_sonic.errors",
    "make_cluster": "coffea_sonic.facility.cluster",
    "check_servers": "coffea_sonic.facility.check",
    "TokenGateway": "coffea_sonic.facility.gateway",
    "SystemShmTransport": "coffea_sonic.transport.shm",
    "CudaShmTransport": "coffea_sonic.transport.shm",
    "HttpTransport": "coffea_sonic.transport.http",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'coffea_sonic' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
