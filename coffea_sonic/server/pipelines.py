"""Write the zoo's multi-stage pipeline (``trackgnn``) into a Triton model repository, two ways.

* ``trackgnn``: one python-backend model running every stage per request (fused);
* ``trackgnn_ensemble``: a Triton ensemble (``platform: "ensemble"``) whose steps are the stage
  models ``trackgnn_embed``, ``trackgnn_graph``, ``trackgnn_filter``, ``trackgnn_gnn`` and
  ``trackgnn_cc``, each a python-backend model; ``hits`` and ``hits__counts`` go to every stage
  that needs them.

Both take the ragged convention of :mod:`coffea_sonic.ragged` (``hits [-1, 3]`` FP32 with
``hits__counts``, per-hit ``labels [-1]`` INT64). Every model folder holds ``model.py``
(``trackgnn_model.py.tmpl``), the pipeline's numeric code ``trackgnn_pipeline.py`` and
``trackgnn_labels.py`` (the modules an in-process run imports) and the weights ``trackgnn.npz``: a repository runs without
coffea-sonic installed on the server (torch and numpy < 2 are needed; scipy is used when
present).

>>> import tempfile
>>> repo = write_pipeline(tempfile.mkdtemp(), "trackgnn_ensemble")
>>> sorted(p.name for p in repo.iterdir())  # doctest: +NORMALIZE_WHITESPACE
['trackgnn_cc', 'trackgnn_embed', 'trackgnn_ensemble', 'trackgnn_filter', 'trackgnn_gnn',
 'trackgnn_graph']
>>> ensemble_config("cpu").ensemble_scheduling.step[0].model_name
'trackgnn_embed'
"""

from __future__ import annotations

import logging
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Iterable

from tritonclient.grpc import model_config_pb2

from ..core.tensors import TensorInfo
from ..errors import ConfigurationError
from ..zoo import trackgnn
from ..zoo import trackgnn_pipeline as stages
from .repository import (DEVICES, Backend, Device, config_text, ragged_model_config, write_model,
                         write_repository)

logger = logging.getLogger(__name__)

#: The served names a user asks for (the stage models come with the ensemble).
PIPELINE_MODELS: tuple[str, ...] = trackgnn.SERVED_NAMES
#: Requests a pipeline model takes in one batch (each request is one group of whole events).
MAX_BATCH_SIZE = 64

_HITS = TensorInfo("hits", "FP32", (3,))
_LABELS = TensorInfo("labels", "INT64", ())


def fused_config(device: Device = "cpu", instances: int = 1,
                 intra_op_threads: int = 0) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` of the fused ``trackgnn`` model (ragged, python backend).

    >>> config = fused_config()
    >>> [(i.name, list(i.dims)) for i in config.input], config.parameters["stage"].string_value
    ([('hits', [-1, 3]), ('hits__counts', [-1])], 'fused')
    """
    return ragged_model_config(
        trackgnn.NAME, [_HITS], [_LABELS], device=device, instances=instances,
        max_batch_size=MAX_BATCH_SIZE,
        parameters={"stage": "fused", "intra_op_threads": str(intra_op_threads)})


def stage_config(stage: str, device: Device = "cpu", instances: int = 1,
                 intra_op_threads: int = 0) -> model_config_pb2.ModelConfig:
    """The ``ModelConfig`` of stage model ``trackgnn_<stage>`` (python backend, one request at a
    time; every tensor ``[1, rows, ...]``).

    >>> [o.name for o in stage_config("graph").output]
    ['graph_edges']
    """
    if stage not in stages.STAGE_TENSORS:
        raise ConfigurationError(f"no trackgnn stage {stage!r}; stages: {list(stages.STAGES)}")
    config = model_config_pb2.ModelConfig(name=f"trackgnn_{stage}", backend="python",
                                          max_batch_size=MAX_BATCH_SIZE)
    config.parameters["stage"].string_value = stage
    config.parameters["device"].string_value = device
    config.parameters["intra_op_threads"].string_value = str(intra_op_threads)
    inputs, outputs = stages.STAGE_TENSORS[stage]
    for declared, (name, datatype, dims) in ([(config.input.add(), t) for t in inputs]
                                             + [(config.output.add(), t) for t in outputs]):
        declared.name, declared.dims[:] = name, [-1, *dims]
        declared.data_type = model_config_pb2.DataType.Value(f"TYPE_{datatype}")
        if name.endswith("__counts"):  # a request without counts is one event
            declared.optional = True
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


def _files(link: bool) -> dict[str, Path]:
    return {"trackgnn_pipeline.py": Path(stages.__file__),
            "trackgnn_labels.py": Path(stages.__file__).with_name("trackgnn_labels.py"),
            "trackgnn.npz": trackgnn.weights_path()}


def _write_python(dest: Path, config: model_config_pb2.ModelConfig, link: bool) -> Path:
    template = resources.files(__package__) / "trackgnn_model.py.tmpl"
    folder = write_model(dest, config, {"model.py": template.read_text()})
    for name, source in _files(link).items():
        target = folder / "1" / name
        if link:
            target.symlink_to(source.resolve())
        else:
            shutil.copyfile(source, target)
    return folder


def write_pipeline(dest: str | os.PathLike, name: str, *, device: Device = "cpu",
                   instances: int = 1, intra_op_threads: int = 0, link: bool = False) -> Path:
    """Write pipeline model ``name`` (:data:`PIPELINE_MODELS`) into repository ``dest``: the
    fused model, or the ensemble with its stage models. Returns ``dest``.

    ``instances``: model instances (per GPU with ``device="gpu"``) of the fused model and of each
    stage model; ``link``: symlink the code and weights instead of copying them.
    """
    if name not in PIPELINE_MODELS:
        raise ConfigurationError(f"no pipeline model {name!r}; pipelines: {list(PIPELINE_MODELS)}")
    if device not in DEVICES:
        raise ConfigurationError(f"device must be one of {DEVICES}, not {device!r}")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if name == trackgnn.NAME:
        _write_python(dest, fused_config(device, instances, intra_op_threads), link)
    else:
        for stage in stages.STAGES:
            _write_python(dest, stage_config(stage, device, instances, intra_op_threads), link)
        folder = dest / trackgnn.ENSEMBLE_NAME
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(config_text(ensemble_config(device)))
    logger.info("wrote pipeline %s into %s (%s)", name, dest, device)
    return dest


def write_models(dest: str | os.PathLike, models: Iterable[str] | None = None, *,
                 backend: Backend = "python", device: Device = "cpu", instances: int = 1,
                 link: bool = False, **config_options) -> Path:
    """Write zoo models and pipelines into repository ``dest``: the zoo's single models through
    :func:`~coffea_sonic.server.repository.write_repository` (with ``config_options``), the
    pipelines (:data:`PIPELINE_MODELS`) through :func:`write_pipeline`. ``models=None``: every
    single zoo model (pipelines are served when named).

    >>> import tempfile
    >>> repo = write_models(tempfile.mkdtemp(), ["jet_tagger", "trackgnn"])
    >>> sorted(p.name for p in repo.iterdir())
    ['jet_tagger', 'trackgnn']
    """
    names = list(models) if models is not None else None
    pipelines = [name for name in names or () if name in PIPELINE_MODELS]
    singles = None if names is None else [name for name in names if name not in PIPELINE_MODELS]
    if pipelines and backend != "python":
        raise ConfigurationError(
            f"{pipelines} run on the python backend only (torch stages), not {backend!r}; "
            "export them with backend='python'")
    dest = Path(dest)
    if singles is None or singles:
        write_repository(dest, singles, backend=backend, device=device, instances=instances,
                         link=link, **config_options)
    threads = int(config_options.get("intra_op_threads", 0) or 0)
    for name in pipelines:
        write_pipeline(dest, name, device=device, instances=instances, link=link,
                       intra_op_threads=threads)
    return dest
