"""Write the zoo's multi-stage pipeline (``trackgnn``) into a Triton model repository, fused or as
an ensemble.

How it works: docs/internals/server.md, "The tracking pipeline" (with an example).
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path
from typing import Iterable

from tritonclient.grpc import model_config_pb2

from ..core.tensors import TensorInfo
from ..errors import ConfigurationError
from ..zoo import trackgnn
from ..zoo import trackgnn_pipeline as stages
from .repository import (DEVICES, Backend, Device, ragged_model_config, write_model,
                         write_repository)

logger = logging.getLogger(__name__)

#: The served names a user asks for (the stage models come with the ensemble).
PIPELINE_MODELS: tuple[str, ...] = trackgnn.SERVED_NAMES
#: Requests a pipeline model takes in one batch (each request is one group of whole events).
MAX_BATCH_SIZE = 64

#: Events of the sample each GPU instance runs when it starts (its largest call; it also runs
#: the first half and quarter of them).
WARM_UP_EVENTS = 400
HANDOFFS = ("host", "device")
#: Instances per GPU of the pipeline models when a server is not told (LocalTritonServer):
#: one. Each model runs the requests waiting for it as one pass (the fused model its execute's
#: requests, a stage model through trackgnn_batch), so one instance keeps a GPU busy with many
#: clients; more instances split those passes and share the GPU between their CUDA contexts
#: (benchmarks/RESULTS.md, "trackgnn: one instance per GPU, stages batched").
PIPELINE_GPU_INSTANCES = 1
#: Triton's CUDA memory pool per GPU a server of the ensemble gets unless a flag sizes it: the
#: GPU tensors its stages hand each other live there. With Triton's default (64 MiB), 16 clients
#: made the gnn stage index past its hits (a device-side assert: wrong edges arrived; past a full
#: pool the python backend hands GPU outputs over by CUDA IPC instead); with 1 GiB they ran right
#: (benchmarks/RESULTS.md, "trackgnn: one instance per GPU, stages batched").
PIPELINE_CUDA_POOL_BYTES = 1 << 30
_POOL_FLAG = "--cuda-memory-pool-byte-size"

_HITS = TensorInfo("hits", "FP32", (3,))
_LABELS = TensorInfo("labels", "INT64", ())


def fused_config(device: Device = "cpu", instances: int = 1, intra_op_threads: int = 0,
                 warm_up: bool | None = None,
                 handoff: str | None = None) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` of the fused ``trackgnn`` model (ragged, python backend).
    ``warm_up`` (None: on a GPU) and ``handoff`` (inputs taken where they arrive) as for
    :func:`stage_config`.

    >>> config = fused_config()
    >>> [(i.name, list(i.dims)) for i in config.input], config.parameters["stage"].string_value
    ([('hits', [-1, 3]), ('hits__counts', [-1])], 'fused')
    >>> gpu = fused_config("gpu")
    >>> gpu.parameters["warm_up"].string_value, gpu.parameters["handoff"].string_value
    ('yes', 'device')
    """
    return ragged_model_config(
        trackgnn.NAME, [_HITS], [_LABELS], device=device, instances=instances,
        max_batch_size=MAX_BATCH_SIZE,
        parameters={"stage": "fused", "intra_op_threads": str(intra_op_threads),
                    **_start_and_handoff(device, warm_up, handoff)})


def handoff_for(device: Device, handoff: str | None = None) -> str:
    """``handoff`` checked against :data:`HANDOFFS`; None: the device's default.

    >>> handoff_for("gpu"), handoff_for("cpu"), handoff_for("gpu", "host")
    ('device', 'host', 'host')
    """
    handoff = handoff or ("device" if device == "gpu" else "host")
    if handoff not in HANDOFFS:
        raise ConfigurationError(f"handoff must be one of {HANDOFFS}, not {handoff!r}")
    return handoff


def cuda_pool_flags(models: Iterable[str] | None, device: str, handoff: str | None, gpus: int,
                    extra_args: Iterable[str] = ()) -> list[str]:
    """The tritonserver flags that give each of ``gpus`` GPUs a CUDA pool of
    :data:`PIPELINE_CUDA_POOL_BYTES` when ``models`` hold the ensemble and its stages hand their
    tensors over on the GPU; none when ``extra_args`` size the pool already.

    >>> cuda_pool_flags(["trackgnn_ensemble"], "gpu", None, 2)
    ['--cuda-memory-pool-byte-size=0:1073741824', '--cuda-memory-pool-byte-size=1:1073741824']
    >>> cuda_pool_flags(["trackgnn_ensemble"], "gpu", "host", 1), cuda_pool_flags(["trackgnn"], "gpu", None, 1)
    ([], [])
    >>> cuda_pool_flags(["trackgnn_ensemble"], "gpu", None, 1, ["--cuda-memory-pool-byte-size=0:0"])
    []
    """
    if (device != "gpu" or trackgnn.ENSEMBLE_NAME not in (models or ())
            or handoff_for(device, handoff) != "device"
            or any(arg.startswith(_POOL_FLAG) for arg in extra_args)):
        return []
    return [f"{_POOL_FLAG}={gpu}:{PIPELINE_CUDA_POOL_BYTES}" for gpu in range(gpus)]


def _start_and_handoff(device: Device, warm_up: bool | None,
                       handoff: str | None) -> dict[str, str]:
    """The config parameters of warming up (None: on a GPU) and of the hand-off, where inputs
    that arrive in GPU memory (a client's, or the previous stage's outputs) stay there."""
    handoff = handoff_for(device, handoff)
    warm = device == "gpu" if warm_up is None else warm_up
    return {"warm_up": "yes" if warm else "no", "handoff": handoff,
            "FORCE_CPU_ONLY_INPUT_TENSORS": "yes" if handoff == "host" else "no"}


def stage_config(stage: str, device: Device = "cpu", instances: int = 1,
                 intra_op_threads: int = 0, warm_up: bool | None = None,
                 handoff: str | None = None) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` of stage model ``trackgnn_<stage>`` (python backend; every tensor
    ``[1, rows, ...]``, ragged: Triton batches requests of any rows, which the model runs in one
    pass). ``warm_up`` (None: on a GPU) and ``handoff`` (:data:`HANDOFFS`; None: ``device`` on a
    GPU, else ``host``) as in docs/internals/server.md.

    >>> [o.name for o in stage_config("graph").output]
    ['graph_edges']
    >>> config = stage_config("cc")
    >>> config.HasField("dynamic_batching"), all(i.allow_ragged_batch for i in config.input)
    (True, True)
    >>> gpu = stage_config("gnn", "gpu")
    >>> gpu.parameters["handoff"].string_value, gpu.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value
    ('device', 'no')
    """
    if stage not in stages.STAGE_TENSORS:
        raise ConfigurationError(f"no trackgnn stage {stage!r}; stages: {list(stages.STAGES)}")
    config = model_config_pb2.ModelConfig(name=f"trackgnn_{stage}", backend="python",
                                          max_batch_size=MAX_BATCH_SIZE)
    parameters = {"stage": stage, "device": device, "intra_op_threads": str(intra_op_threads),
                  **_start_and_handoff(device, warm_up, handoff)}
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    inputs, outputs = stages.STAGE_TENSORS[stage]
    for declared, (name, datatype, dims) in ([(config.input.add(), t) for t in inputs]
                                             + [(config.output.add(), t) for t in outputs]):
        declared.name, declared.dims[:] = name, [-1, *dims]
        declared.data_type = model_config_pb2.DataType.Value(f"TYPE_{datatype}")
        if name.endswith("__counts"):  # a request without counts is one event
            declared.optional = True
    for declared in config.input:
        declared.allow_ragged_batch = True
    # under load, requests queued together run as one pass (trackgnn_batch): fewer, larger
    # launches; alone, a request runs at once (no queue delay)
    config.dynamic_batching.SetInParent()
    group = config.instance_group.add(count=instances)
    group.kind = group.KIND_GPU if device == "gpu" else group.KIND_CPU
    return config


def ensemble_config(device: Device = "cpu") -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` of ``trackgnn_ensemble``: the ragged declaration of the fused model,
    ``platform: "ensemble"``, one step per stage (tensors keep their names between stages)."""
    fused = fused_config(device)
    config = model_config_pb2.ModelConfig(name=trackgnn.ENSEMBLE_NAME, platform="ensemble",
                                          max_batch_size=MAX_BATCH_SIZE)
    config.input.extend(fused.input)
    config.output.extend(fused.output)
    config.batch_output.extend(fused.batch_output)
    for stage in stages.STAGES:
        inputs, outputs = stages.STAGE_TENSORS[stage]
        step = config.ensemble_scheduling.step.add(model_name=f"trackgnn_{stage}",
                                                   model_version=-1)
        for name, _, _ in inputs:
            step.input_map[name] = name
        for name, _, _ in outputs:
            step.output_map[name] = name
    return config


def _files() -> dict[str, Path]:
    return {"trackgnn_pipeline.py": Path(stages.__file__),
            "trackgnn_labels.py": Path(stages.__file__).with_name("trackgnn_labels.py"),
            "trackgnn_batch.py": Path(stages.__file__).with_name("trackgnn_batch.py"),
            "trackgnn.npz": trackgnn.weights_path()}


def write_warm_up_sample(path: str | os.PathLike, events: int = WARM_UP_EVENTS) -> Path:
    """Write the synthetic events a starting instance runs (``hits`` ``[R, 3]`` float32 and
    ``counts`` ``[events]`` int64, :mod:`coffea_sonic.data.hits`, a seed of its own) to ``path``.

    >>> import tempfile, numpy as np
    >>> with np.load(write_warm_up_sample(Path(tempfile.mkdtemp()) / "w.npz", 5)) as sample:
    ...     len(sample["counts"]), int(sample["counts"].sum()) == len(sample["hits"])
    (5, True)
    """
    import numpy as np

    from ..data.hits import generate_hits

    drawn = generate_hits(events, seed=20261127)
    fields = drawn["fields"]
    hits = np.stack([fields["x"], fields["y"], fields["z"]], axis=1).astype(np.float32)
    path = Path(path)
    with open(path, "wb") as sink:
        np.savez(sink, hits=hits, counts=np.asarray(drawn["counts"], dtype=np.int64))
    return path


def _write_python(dest: Path, config: model_config_pb2.ModelConfig, link: bool,
                  sample: Path | None) -> Path:
    """Write one python-backend model; its warm-up sample is ``sample`` (linked or copied), or
    drawn into its folder when None. Returns the sample's path."""
    template = resources.files(__package__) / "trackgnn_model.py.tmpl"
    files: dict[str, str | Path] = {"model.py": template.read_text(), **_files()}
    if sample is not None:
        files["trackgnn_warmup.npz"] = sample
    folder = write_model(dest, config, files, link=link)
    return sample or write_warm_up_sample(folder / "1" / "trackgnn_warmup.npz")


def write_pipeline(dest: str | os.PathLike, name: str, *, device: Device = "cpu",
                   instances: int = 1, intra_op_threads: int = 0, link: bool = False,
                   warm_up: bool | None = None, handoff: str | None = None) -> Path:
    """Write pipeline model ``name`` (:data:`PIPELINE_MODELS`) into repository ``dest``: the
    fused model, or the ensemble with its stage models. Returns ``dest``.

    ``instances``: model instances (per GPU with ``device="gpu"``) of the fused model and of each
    stage model; ``link``: symlink the code and weights instead of copying them; ``warm_up`` and
    ``handoff``: see :func:`stage_config` (None: the device's default).
    """
    if name not in PIPELINE_MODELS:
        raise ConfigurationError(f"no pipeline model {name!r}; pipelines: {list(PIPELINE_MODELS)}")
    if device not in DEVICES:
        raise ConfigurationError(f"device must be one of {DEVICES}, not {device!r}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if name == trackgnn.NAME:
        _write_python(dest, fused_config(device, instances, intra_op_threads, warm_up, handoff),
                      link, None)
    else:
        sample = None
        for stage in stages.STAGES:
            sample = _write_python(dest, stage_config(stage, device, instances, intra_op_threads,
                                                      warm_up, handoff), link, sample)
        write_model(dest, ensemble_config(device), {})
    logger.info("wrote pipeline %s into %s (%s)", name, dest, device)
    return dest


def write_models(dest: str | os.PathLike, models: Iterable[str] | None = None, *,
                 backend: Backend = "python", device: Device = "cpu", instances: int = 1,
                 link: bool = False, pipeline_instances: int | None = None,
                 **config_options) -> Path:
    """Write zoo models and pipelines into repository ``dest``: the zoo's single models through
    :func:`~coffea_sonic.server.repository.write_repository` (with ``config_options``), the
    pipelines (:data:`PIPELINE_MODELS`) through :func:`write_pipeline`, tree models through
    :func:`~coffea_sonic.zoo.trees.write_tree_model` when named. ``models=None``: every
    single zoo model (pipelines are served when named). ``instances`` per device of every model;
    ``pipeline_instances`` (None: ``instances``) of the pipelines' models.

    >>> import tempfile
    >>> repo = write_models(tempfile.mkdtemp(), ["jet_tagger", "trackgnn"], device="gpu",
    ...                     instances=6, pipeline_instances=1)
    >>> sorted(p.name for p in repo.iterdir())
    ['jet_tagger', 'trackgnn']
    >>> [("count: 6" in (repo / name / "config.pbtxt").read_text(),
    ...   "count: 1" in (repo / name / "config.pbtxt").read_text()) for name in ("jet_tagger", "trackgnn")]
    [(True, False), (False, True)]
    """
    from ..zoo.trees import tree_names, write_tree_model

    names = list(models) if models is not None else None
    pipelines = [name for name in names or () if name in PIPELINE_MODELS]
    trees = [name for name in names or () if name in tree_names()]
    singles = None if names is None else [name for name in names
                                          if name not in PIPELINE_MODELS and name not in trees]
    if pipelines and backend != "python":
        raise ConfigurationError(
            f"{pipelines} run on the python backend only (torch stages), not {backend!r}; "
            "export them with backend='python'")
    dest = Path(dest)
    pipeline_options = {key: config_options.pop(key) for key in ("warm_up", "handoff")
                        if key in config_options}
    if singles is None or singles:
        write_repository(dest, singles, backend=backend, device=device, instances=instances,
                         link=link, **config_options)
    for name in trees:  # Triton's FIL backend (the embedded server's python-based one)
        write_tree_model(dest, name, device=device, link=link)
    threads = int(config_options.get("intra_op_threads", 0) or 0)
    for name in pipelines:
        write_pipeline(dest, name, device=device, instances=pipeline_instances or instances,
                       link=link,
                       intra_op_threads=threads, **pipeline_options)
    return dest
