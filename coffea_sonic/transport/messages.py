"""Triton's protocol messages -> our core types (docs/internals/transport.md)."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from ..core.tensors import ModelInfo, TensorInfo, signature_checksum
from ..stats import ServerStatistics

__all__ = ["answering_digest", "model_info_from_responses", "models_in_index", "statistics_from_response"]


def _tensors(declared: Any) -> tuple[TensorInfo, ...]:
    from tritonclient.grpc import model_config_pb2

    name_of = model_config_pb2.DataType.Name
    # configs say TYPE_STRING for BYTES (metadata says BYTES)
    return tuple(
        TensorInfo(name=t.name,
                   datatype=name_of(t.data_type).removeprefix("TYPE_").replace("STRING", "BYTES"),
                   dims=tuple(int(d) for d in t.dims),
                   labelled=bool(getattr(t, "label_filename", "")))
        for t in declared)


def model_info_from_responses(metadata: Any, config: Any) -> ModelInfo:
    """Build :class:`ModelInfo` from gRPC ``ModelMetadataResponse`` and ``ModelConfigResponse``."""
    from tritonclient.grpc import model_config_pb2

    declared = config.config
    platform = declared.backend or declared.platform or metadata.platform
    inputs = _tensors(declared.input)
    outputs = _tensors(declared.output)
    if not inputs and metadata.inputs:  # config-less (auto-completed) models: trust the metadata
        skip = 1 if declared.max_batch_size > 0 else 0
        inputs = tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)[skip:]) for t in metadata.inputs)
        outputs = tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)[skip:]) for t in metadata.outputs)
    # ragged batching (coffea_sonic.ragged): inputs that may differ in shape within a batch, and
    # outputs scattered like such an input (one row per object, not per event)
    ragged_inputs = tuple(t.name for t in declared.input if t.allow_ragged_batch)
    scatter = model_config_pb2.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE
    ragged_outputs = tuple(name for batch_output in declared.batch_output
                           if batch_output.kind == scatter for name in batch_output.target_name)
    # Triton's loaded config lists the GPUs of each KIND_GPU group (every visible one if the
    # repository named none)
    gpus = tuple(sorted({int(gpu) for group in declared.instance_group
                         if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
                         for gpu in (group.gpus or [0])}))
    checksum = signature_checksum(platform, int(declared.max_batch_size), inputs, outputs,
                                  ragged_inputs, ragged_outputs, answering_digest(declared))
    return ModelInfo(name=metadata.name, versions=tuple(metadata.versions), platform=platform,
                     max_batch_size=int(declared.max_batch_size), inputs=inputs, outputs=outputs,
                     checksum=checksum, ragged_inputs=ragged_inputs, ragged_outputs=ragged_outputs,
                     gpus=gpus, response_cache=bool(declared.response_cache.enable))


def answering_digest(config: Any) -> str:
    """A digest of the parts of a served ``ModelConfig`` that change answers but not the
    signature ("" when none is set; which parts: docs/internals/transport.md, "Messages").

    >>> from tritonclient.grpc import model_config_pb2
    >>> answering_digest(model_config_pb2.ModelConfig(name="m"))
    ''
    """
    from google.protobuf import json_format

    as_dict = functools.partial(json_format.MessageToDict, preserving_proto_field_name=True)
    parts: dict[str, Any] = {}
    if config.optimization.HasField("graph"):
        parts["graph"] = config.optimization.graph.level
    if config.optimization.HasField("execution_accelerators"):
        parts["accelerators"] = as_dict(config.optimization.execution_accelerators)
    labels = {t.name: t.label_filename for t in config.output if t.label_filename}
    if labels:
        parts["labels"] = labels
    if config.default_model_filename:
        parts["file"] = config.default_model_filename
    for key, entries in (("steps", config.ensemble_scheduling.step),
                         ("batch_input", config.batch_input), ("batch_output", config.batch_output)):
        if len(entries):
            parts[key] = [as_dict(entry) for entry in entries]
    if not parts:
        return ""
    canonical = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


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


def statistics_from_response(response: Any, model: str) -> ServerStatistics:
    """Summed :class:`~coffea_sonic.stats.ServerStatistics` of ``model``'s versions in a
    ``ModelStatisticsResponse``."""
    total = ServerStatistics()
    for entry in response.model_stats:
        if entry.name == model:
            total += ServerStatistics.from_model_stats([entry])
    return total
