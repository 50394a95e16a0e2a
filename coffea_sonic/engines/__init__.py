"""In-process engines that run the zoo models without a server, on the same input dicts.

What each runs, with examples: docs/internals/engines.md.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

import numpy as np

from .. import zoo
from ..errors import InputValidationError, MissingDependencyError, require

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    # TreeEngine lives in engines.trees (tritonclient's protobufs); imported when first asked for
    if name == "TreeEngine":
        from .trees import TreeEngine

        return TreeEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["CpuEngine", "GpuEngine", "TreeEngine", "declared_info", "fallback_engine",
           "reference_engine"]


def _check_inputs(name: str, inputs: Mapping[str, np.ndarray]) -> None:
    expected = zoo.spec(name).input_names
    missing = [key for key in expected if key not in inputs]
    extra = [key for key in inputs if key not in expected]
    if missing or extra:
        raise InputValidationError(
            f"model {name!r} takes inputs {list(expected)}; missing {missing}, unexpected {extra}")


class CpuEngine:
    """Run zoo model ``name`` (or any ONNX file via ``onnx_file``) in-process with onnxruntime.

    ``threads`` = 0 lets onnxruntime use every core.

    >>> CpuEngine("emtrk_cnn").output_names
    ('em_trk_none', 'michel')
    """

    def __init__(self, name: str, *, threads: int = 0, onnx_file: str | os.PathLike | None = None):
        onnxruntime = require("onnxruntime", f"CpuEngine({name!r}) (in-process inference, "
                                             "fallback='cpu')")

        self.name = name
        self.model_spec = zoo.spec(name)
        self.output_names = self.model_spec.output_names
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(onnx_file or zoo.onnx_path(name)), sess_options=options,
            providers=["CPUExecutionProvider"])

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        _check_inputs(self.name, inputs)
        feed = {t.name: np.ascontiguousarray(inputs[t.name], dtype=t.dtype)
                for t in self.model_spec.inputs}
        return dict(zip(self.output_names, self.session.run(list(self.output_names), feed)))

    def __repr__(self) -> str:
        return f"CpuEngine({self.name!r})"

    def __getstate__(self) -> dict:
        # onnxruntime sessions do not pickle; the receiving process builds its own.
        return {"name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["name"])


class GpuEngine:
    """Run zoo model ``name`` in-process with torch on a CUDA device (weights = the ONNX's).

    Inputs are numpy arrays on the host; the timing therefore includes host<->device copies,
    as a local GPU in an analysis job would pay them.

    >>> GpuEngine("jet_tagger")
    GpuEngine('jet_tagger', cuda:0)
    """

    def __init__(self, name: str, *, device: str = "cuda:0") -> None:
        torch = require("torch", "GpuEngine")
        if not torch.cuda.is_available():
            raise MissingDependencyError(
                f"GpuEngine({name!r}) needs a CUDA GPU and none is visible; use CpuEngine instead")
        # TF32 convolutions/matmuls differ from onnxruntime by ~3e-4 on emtrk_cnn (measured on an
        # H100); full fp32 keeps GPU and CPU engines within 1e-5 and was not slower there.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        self.torch = torch
        self.name = name
        self.model_spec = zoo.spec(name)
        self.output_names = self.model_spec.output_names
        self.device = torch.device(device)
        self.module = zoo.torch_module(name).to(self.device).eval()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        _check_inputs(self.name, inputs)
        torch = self.torch
        with torch.inference_mode():
            tensors = [torch.from_numpy(np.ascontiguousarray(inputs[t.name], dtype=t.dtype))
                       .pin_memory().to(self.device, non_blocking=True)
                       for t in self.model_spec.inputs]
            values = self.module(*tensors)
            if not isinstance(values, (tuple, list)):
                values = (values,)
            return {name: value.cpu().numpy() for name, value in zip(self.output_names, values)}

    def __repr__(self) -> str:
        return f"GpuEngine({self.name!r}, {self.device})"


def fallback_engine(model: str, version: str = "") -> "CpuEngine | TreeEngine":
    """The engine of ``fallback="cpu"``: a zoo model in-process with onnxruntime, a zoo tree
    model or a FIL model of the setting ``fallback_repository`` with its tree library
    (``version`` of it: the one the URL names, else the newest).

    >>> fallback_engine("no_such_model")
    Traceback (most recent call last):
    ...
    coffea_sonic.errors.ConfigurationError: fallback='cpu' runs zoo models and tree models, and 'no_such_model' is neither a zoo model nor a FIL model of the setting fallback_repository (none set); pass fallback=factory with factory(model_name) -> engine(inputs) -> outputs
    """
    tree = _tree_engine(model, version)
    if tree is not None:
        return tree
    _zoo_only(model)
    return CpuEngine(model)


def declared_info(model: str):
    """What ``model`` declares for ``fallback="cpu"``: the zoo's declaration (ONNX or tree
    model), or that of the fallback repository's FIL model; None if none of them has it."""
    from ..zoo.trees import declared_tree_info

    declared = zoo.declared_info(model) or declared_tree_info(model)
    if declared is None:
        tree = _tree_engine(model, "")
        declared = tree.info if tree is not None else None
    return declared


def _tree_engine(model: str, version: str) -> "TreeEngine | None":
    from ..zoo.trees import tree_names
    from .trees import TreeEngine, is_tree_folder

    if model in tree_names():
        return TreeEngine.from_zoo(model, int(version) if version else None)
    repository = _fallback_repository()
    if repository is not None and is_tree_folder(repository / model):
        return TreeEngine.from_folder(repository / model, int(version) if version else None)
    return None


def _fallback_repository():
    from pathlib import Path

    from ..config import setting

    value = setting("fallback_repository")
    return Path(str(value)).expanduser().resolve() if value else None


def _zoo_only(model: str) -> None:
    from ..errors import ConfigurationError

    if model not in zoo.names():
        repository = _fallback_repository()
        raise ConfigurationError(
            f"fallback='cpu' runs zoo models and tree models, and {model!r} is neither a zoo "
            "model nor a FIL model of the setting fallback_repository "
            f"({repository or 'none set'}); pass fallback=factory with factory(model_name) -> "
            "engine(inputs) -> outputs")


def reference_engine(model: str, version: str = "") -> "CpuEngine | TreeEngine":
    """Shadow validation's reference for ``fallback="cpu"``: the same model on ONE onnxruntime
    thread (why: docs/internals/engines.md).

    >>> reference_engine("jet_tagger").session.get_session_options().intra_op_num_threads
    1
    """
    tree = _tree_engine(model, version)
    if tree is not None:
        return tree
    _zoo_only(model)
    return CpuEngine(model, threads=1)
