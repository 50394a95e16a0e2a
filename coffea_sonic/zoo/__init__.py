"""Example HEP models of the SONIC papers, declared once, exported to ONNX, served by Triton.

The models: docs/development.md; how the zoo is put together, with examples:
docs/internals/zoo.md.
"""

from __future__ import annotations

import logging
import os
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ModelNotFoundError, require
from .spec import (EMTRK_PATCH, JET_CLASSES, JET_TAGGER_FEATURES, MODEL_SPECS,
                   PARTICLENET_FEATURES, PARTICLENET_MAX_CONSTITUENTS, ModelSpec, TensorSpec)

__all__ = [
    "declared_info",
    "JET_CLASSES", "JET_TAGGER_FEATURES", "PARTICLENET_FEATURES", "PARTICLENET_MAX_CONSTITUENTS",
    "ModelSpec", "TensorSpec", "cache_dir", "example_inputs", "export_onnx", "names", "onnx_path",
    "pipeline_names", "pipelines",
    "spec", "torch_module",
]

logger = logging.getLogger(__name__)

#: Bumped whenever a generated (not shipped) model changes, so stale caches are not reused.
GENERATED_MODEL_REVISION = 1


def names() -> list[str]:
    """Names of the zoo models, sorted.

    >>> "jet_tagger" in names()
    True
    """
    return sorted(MODEL_SPECS)


def pipeline_names() -> list[str]:
    """Served names of the zoo's pipelines (not in :func:`names`: no single ONNX file).

    >>> pipeline_names()
    ['trackgnn', 'trackgnn_ensemble']
    """
    return list(pipelines())


def pipelines() -> dict[str, str]:
    """Served pipeline name -> description."""
    from . import trackgnn

    return {trackgnn.NAME: trackgnn.DESCRIPTION,
            trackgnn.ENSEMBLE_NAME: "the same pipeline as a Triton ensemble of one python-backend "
                                    "model per stage (" + ", ".join(trackgnn.STAGE_MODELS) + ")"}


def spec(name: str) -> ModelSpec:
    """The declaration (inputs, outputs, batching) of zoo model ``name``.

    >>> spec("jet_tagger").output_names
    ('probs',)
    """
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ModelNotFoundError(f"no zoo model {name!r}; the zoo has {names()}") from None


def cache_dir() -> Path:
    """Where generated models are cached: ``$COFFEA_SONIC_CACHE`` or ``~/.cache/coffea-sonic``.

    >>> cache_dir().name in ("coffea-sonic",) or "COFFEA_SONIC_CACHE" in os.environ
    True
    """
    root = os.environ.get("COFFEA_SONIC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "coffea-sonic")
    return Path(root)


def onnx_path(name: str) -> Path:
    """Path of the ONNX file of zoo model ``name``; a generated model is built on first use.

    >>> onnx_path("jet_tagger").suffix
    '.onnx'
    """
    model_spec = spec(name)
    if model_spec.shipped:
        shipped = resources.files(__name__) / f"{name}.onnx"
        path = Path(str(shipped))
        if not path.is_file():
            raise ModelNotFoundError(
                f"package data {path} is missing; reinstall coffea-sonic (in a checkout: "
                f"`python -m zoo_training.export {name}` in scripts/)")
        return path
    path = cache_dir() / "zoo" / f"{name}-r{GENERATED_MODEL_REVISION}.onnx"
    if not path.is_file():
        logger.info("generating %s once (deterministic weights) into %s", name, path)
        export_onnx(name, path)
    return path


def torch_module(name: str):
    """The torch module of ``name`` with exactly the weights of its ONNX file (needs torch).

    Shipped (trained) models take their weights from the ONNX initializers, so the in-process GPU
    engine and the served model can never disagree about which weights they run.
    """
    from . import torch_models

    if not spec(name).shipped:
        return torch_models.build(name)
    onnx = require("onnx", f"the torch module of {name}")
    torch = require("torch", f"the torch module of {name}")
    from onnx import numpy_helper

    initializers = {init.name: numpy_helper.to_array(init)
                    for init in onnx.load(str(onnx_path(name))).graph.initializer}
    module = torch_models.build(name)
    wanted = module.state_dict()
    missing = [key for key in wanted if key not in initializers]
    if missing:
        raise ModelNotFoundError(
            f"{onnx_path(name)} lacks weights {missing[:4]} of the torch definition of {name}; "
            "re-export it with `python -m zoo_training.export` in a checkout's scripts/")
    module.load_state_dict({key: torch.from_numpy(np.array(initializers[key])) for key in wanted})
    return module.eval()


def export_onnx(name: str, path: str | os.PathLike, module=None) -> Path:
    """Export zoo model ``name`` (deterministic weights, or ``module``) to ONNX at ``path``.

    The batch dimension is dynamic; input/output names come from the declaration. The file is
    written atomically, so concurrent first uses never see half a model.
    """
    torch = require("torch", f"exporting {name}")
    from . import torch_models

    model_spec = spec(name)
    module = module if module is not None else torch_models.build(name)
    module = module.eval()
    example = {key: torch.from_numpy(value)
               for key, value in example_inputs(name, 2).items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dynamic = {tensor.name: {0: "batch"} for tensor in model_spec.inputs + model_spec.outputs}
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        scratch_path = Path(scratch) / path.name
        torch.onnx.export(
            module, tuple(example[n] for n in model_spec.input_names), str(scratch_path),
            input_names=list(model_spec.input_names), output_names=list(model_spec.output_names),
            dynamic_axes=dynamic, opset_version=17, dynamo=False, do_constant_folding=False,
        )
        os.replace(scratch_path, path)
    return path


def example_inputs(name: str, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A dict of ``n`` valid, physically plausible input rows for zoo model ``name``.

    >>> x = example_inputs("particlenet_lite", 3)
    >>> x["pf_points"].shape, x["pf_mask"].dtype
    ((3, 2, 32), dtype('float32'))
    """
    spec(name)  # unknown names raise ModelNotFoundError here
    rng = np.random.default_rng(seed)
    if name == "jet_tagger":
        columns = [
            20.0 + rng.exponential(40.0, n),        # pt
            rng.uniform(-2.5, 2.5, n),              # eta
            rng.uniform(-np.pi, np.pi, n),          # phi
            rng.uniform(2.0, 30.0, n),              # mass
            rng.uniform(0.0, 1.0, n),               # btagDeepFlavB
            rng.integers(2, 40, n).astype(float),   # nConstituents
        ]
        return {"features": np.stack(columns, axis=1).astype(np.float32).reshape(n, len(columns))}
    if name in ("particlenet_lite", "particlenet"):
        size = PARTICLENET_MAX_CONSTITUENTS
        counts = rng.integers(1, size + 1, n)
        mask = (np.arange(size)[None, :] < counts[:, None]).astype(np.float32)[:, None, :]
        points = rng.normal(0.0, 0.2, (n, 2, size)).astype(np.float32) * mask
        features = rng.normal(0.0, 1.0, (n, len(PARTICLENET_FEATURES), size)).astype(np.float32)
        return {"pf_points": points, "pf_features": features * mask, "pf_mask": mask}
    if name == "deepmet":
        from .spec import DEEPMET_CLASSES, DEEPMET_MAX_CANDIDATES

        size = DEEPMET_MAX_CANDIDATES
        counts = rng.integers(0, size + 1, n)
        real = np.arange(size)[None, :] < counts[:, None]
        pt = 0.3 + rng.exponential(5.0, (n, size))
        phi = rng.uniform(-np.pi, np.pi, (n, size))
        cont = np.stack([pt * np.cos(phi), pt * np.sin(phi), np.log(pt),
                         rng.uniform(-2.5, 2.5, (n, size))], axis=2) * real[:, :, None]
        classes = rng.integers(1, len(DEEPMET_CLASSES), (n, size)) * real
        return {"pf_cont": cont.astype(np.float32), "pf_class": classes.astype(np.float32)}
    if name == "emtrk_cnn":
        patch = rng.uniform(0.0, 1.0, (n, 1, EMTRK_PATCH, EMTRK_PATCH)).astype(np.float32)
        return {"patch": patch}
    raise ModelNotFoundError(f"no example inputs for {name!r}")  # pragma: no cover


def declared_info(name: str):
    """The zoo's declaration of model ``name`` as a :class:`~coffea_sonic.core.tensors.ModelInfo`
    (what a server serving it would declare), or None if the zoo has no such model.

    >>> declared_info("jet_tagger").inputs[0].describe()
    'features FP32[6]'
    """
    from ..core.tensors import ModelInfo

    if name not in names():
        return None
    declared = spec(name)
    return ModelInfo(name=name, versions=("1",), platform="python",
                     max_batch_size=declared.max_batch_size,
                     inputs=tuple(t.info for t in declared.inputs),
                     outputs=tuple(t.info for t in declared.outputs))
