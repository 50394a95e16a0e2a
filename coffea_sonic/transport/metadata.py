"""What a served model declares (inputs, outputs, batching), fetched once per process and cached.

The model config is the source of truth for per-row dims (``dims`` exclude the batch dimension when
``max_batch_size > 0``); the metadata gives the available versions. A checksum over the signature
(backend, batching, tensor names/dtypes/dims) lets clients detect that two servers, or a server and
the analysis' expectation, disagree about a model.

>>> info = ModelInfo(name="m", versions=("1",), platform="python", max_batch_size=8,
...                  inputs=(TensorInfo("x", "FP32", (4,)),), outputs=(TensorInfo("y", "FP32", (2,)),))
>>> info.inputs[0].dtype, info.batching, len(info.checksum)
(dtype('float32'), True, 16)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import ModelNotFoundError
from .channel import Connection
from .codec import numpy_dtype
from .status import as_sonic_error

__all__ = ["ModelInfo", "TensorInfo", "clear_cache", "fetch_model_info", "served_models"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorInfo:
    """One declared tensor: name, Triton datatype (``"FP32"``), per-row dims (``-1`` = variable).

    >>> TensorInfo("x", "FP32", (-1, 3)).describe()
    'x FP32[-1, 3]'
    """

    name: str
    datatype: str
    dims: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.datatype)

    def describe(self) -> str:
        return f"{self.name} {self.datatype}{list(self.dims)}"


@dataclass(frozen=True)
class ModelInfo:
    """The served signature of one model (one version, or the latest when ``version`` is ``""``)."""

    name: str
    versions: tuple[str, ...]
    platform: str
    max_batch_size: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    checksum: str = field(default="")

    def __post_init__(self) -> None:
        if not self.checksum:
            object.__setattr__(self, "checksum", signature_checksum(
                self.platform, self.max_batch_size, self.inputs, self.outputs))

    @property
    def batching(self) -> bool:
        """True if the model takes a leading batch dimension (``max_batch_size > 0``)."""
        return self.max_batch_size > 0

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @property
    def latest_version(self) -> str:
        numeric = [v for v in self.versions if v.isdigit()]
        return max(numeric, key=int) if numeric else ""

    def describe(self) -> str:
        """One line: ``name: inputs -> outputs (max_batch_size N)``."""
        ins = ", ".join(t.describe() for t in self.inputs)
        outs = ", ".join(t.describe() for t in self.outputs)
        return f"{self.name}: {ins} -> {outs} (max_batch_size {self.max_batch_size})"


def signature_checksum(platform: str, max_batch_size: int, inputs: Sequence[TensorInfo],
                       outputs: Sequence[TensorInfo]) -> str:
    """16 hex digits over what a client relies on (not instance counts or devices).

    >>> len(signature_checksum("python", 8, [TensorInfo("x", "FP32", (4,))], []))
    16
    """
    canonical = json.dumps({
        "platform": platform, "max_batch_size": max_batch_size,
        "inputs": [[t.name, t.datatype, list(t.dims)] for t in inputs],
        "outputs": [[t.name, t.datatype, list(t.dims)] for t in outputs],
    }, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _tensors(declared: Any) -> tuple[TensorInfo, ...]:
    from tritonclient.grpc import model_config_pb2

    return tuple(
        TensorInfo(name=t.name,
                   datatype=model_config_pb2.DataType.Name(t.data_type).removeprefix("TYPE_"),
                   dims=tuple(int(d) for d in t.dims))
        for t in declared)


def model_info_from_responses(metadata: Any, config: Any) -> ModelInfo:
    """Build :class:`ModelInfo` from gRPC ``ModelMetadataResponse`` and ``ModelConfigResponse``."""
    declared = config.config
    platform = declared.backend or declared.platform or metadata.platform
    inputs = _tensors(declared.input)
    outputs = _tensors(declared.output)
    if not inputs and metadata.inputs:  # config-less (auto-completed) models: trust the metadata
        skip = 1 if declared.max_batch_size > 0 else 0
        inputs = tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)[skip:]) for t in metadata.inputs)
        outputs = tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)[skip:]) for t in metadata.outputs)
    # BYTES is reported as TYPE_STRING in configs
    inputs = tuple(TensorInfo(t.name, "BYTES" if t.datatype == "STRING" else t.datatype, t.dims)
                   for t in inputs)
    outputs = tuple(TensorInfo(t.name, "BYTES" if t.datatype == "STRING" else t.datatype, t.dims)
                    for t in outputs)
    return ModelInfo(name=metadata.name, versions=tuple(metadata.versions), platform=platform,
                     max_batch_size=int(declared.max_batch_size), inputs=inputs, outputs=outputs)


_cache: dict[tuple, ModelInfo] = {}
_cache_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _cache_lock
    _cache_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def clear_cache() -> None:
    """Forget every cached :class:`ModelInfo` of this process."""
    with _cache_lock:
        _cache.clear()


def served_models(connection: Connection, *, timeout_s: float,
                  metadata: Sequence[tuple[str, str]] = ()) -> dict[str, tuple[str, ...]]:
    """``{model: (ready versions...)}`` from the server's repository index."""
    from tritonclient.grpc import service_pb2

    index = connection.stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True),
                                            timeout=timeout_s, metadata=metadata)
    return models_in_index(index)


def models_in_index(index: Any) -> dict[str, tuple[str, ...]]:
    """``{model: (ready versions...)}`` of a ``RepositoryIndexResponse`` (versions in order)."""
    served: dict[str, list[str]] = {}
    for entry in index.models:
        if entry.state and entry.state != "READY":
            continue
        served.setdefault(entry.name, [])
        if entry.version:
            served[entry.name].append(entry.version)
    return {name: tuple(sorted(versions, key=lambda v: int(v) if v.isdigit() else 0))
            for name, versions in sorted(served.items())}


def fetch_model_info(connection: Connection, model: str, version: str = "", *, timeout_s: float,
                     metadata: Sequence[tuple[str, str]] = (), refresh: bool = False) -> ModelInfo:
    """The :class:`ModelInfo` of ``model``/``version`` on ``connection`` (cached per process).

    Raises :class:`~coffea_sonic.errors.ModelNotFoundError` naming what the server does serve.
    """
    import grpc
    from tritonclient.grpc import service_pb2

    key = (os.getpid(), connection.address, connection.tls.key() if connection.tls else None,
           model, version)
    if not refresh:
        cached = _cache.get(key)
        if cached is not None:
            return cached
    try:
        meta = connection.stub.ModelMetadata(
            service_pb2.ModelMetadataRequest(name=model, version=version),
            timeout=timeout_s, metadata=metadata)
        config = connection.stub.ModelConfig(
            service_pb2.ModelConfigRequest(name=model, version=version),
            timeout=timeout_s, metadata=metadata)
    except grpc.RpcError as error:
        converted = as_sonic_error(error, model=model, version=version, address=connection.address)
        if isinstance(converted, ModelNotFoundError):
            try:
                served = served_models(connection, timeout_s=timeout_s, metadata=metadata)
                listing = ", ".join(f"{name} (versions {', '.join(v) or '?'})"
                                    for name, v in served.items()) or "nothing"
            except grpc.RpcError:
                listing = "(repository index unavailable)"
            what = f"model {model!r}" + (f" version {version}" if version else "")
            raise ModelNotFoundError(
                f"Triton at {connection.address} does not serve {what}; it serves: {listing}"
            ) from None
        raise converted from None
    info = model_info_from_responses(meta, config)
    with _cache_lock:
        _cache[key] = info
    logger.debug("model %s at %s: %s", model, connection.address, info.describe())
    return info
