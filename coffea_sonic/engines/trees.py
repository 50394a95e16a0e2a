"""Tree models in-process: a Triton FIL-backend model (a repository's folder, or a zoo tree model)
run by its own library, answering exactly as the served model answers.

What ``fallback="cpu"`` runs for a tree model (docs/internals/engines.md, with an example).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..errors import ConfigurationError, InputValidationError
from .forest import SHAP_OUTPUT, FilOptions, Forest, ForestError

logger = logging.getLogger(__name__)

__all__ = ["TreeEngine", "is_tree_folder"]


def is_tree_folder(folder: Path) -> bool:
    """Whether ``folder`` is a model folder whose config.pbtxt names Triton's FIL backend."""
    config = folder / "config.pbtxt"
    return config.is_file() and _read(config).backend == "fil"


def _read(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


class TreeEngine:
    """One version of a FIL model, in-process: ``engine({"input__0": rows}) -> {outputs}``.

    ``device``: ``"cpu"`` or ``"cuda:N"`` (XGBoost on that GPU). Picklable: a Dask worker reads
    the file again.
    """

    def __init__(self, name: str, config_text: str, path: str | os.PathLike, version: int, *,
                 device: str = "cpu") -> None:
        self.name, self.version, self.path, self.device = name, int(version), str(path), device
        self.config_text = config_text
        config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        self.widths = {o.name: int(np.prod(list(o.dims) or [1])) for o in config.output}
        self.features = int(np.prod(list(config.input[0].dims))) if config.input else 0
        try:
            options = FilOptions.from_parameters(parameters, config.default_model_filename)
            self.forest = Forest(self.path, options, device=device,
                                 shap=SHAP_OUTPUT in self.widths)
        except ForestError as error:
            raise ConfigurationError(f"tree model {name!r} version {version}: {error}") from None
        self.info = self._info(config)

    @classmethod
    def from_folder(cls, folder: str | os.PathLike, version: int | None = None, *,
                    device: str = "cpu") -> "TreeEngine":
        """The model of a repository folder (``REPO/NAME``); ``version`` None: the newest."""
        folder = Path(folder)
        if not is_tree_folder(folder):
            raise ConfigurationError(f"{folder} is not a Triton FIL-backend model (no config.pbtxt "
                                     "saying backend: \"fil\")")
        versions = sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())
        chosen = int(version) if version else (versions[-1] if versions else 1)
        if chosen not in versions:
            raise ConfigurationError(f"tree model {folder.name!r} has versions {versions}, not "
                                     f"{chosen}")
        config_text = (folder / "config.pbtxt").read_text()
        config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
        filename = FilOptions.from_parameters(
            {k: v.string_value for k, v in config.parameters.items()},
            config.default_model_filename).filename
        return cls(folder.name, config_text, folder / str(chosen) / filename, chosen,
                   device=device)

    @classmethod
    def from_zoo(cls, name: str, version: int | None = None, *,
                 device: str = "cpu") -> "TreeEngine":
        """Zoo tree model ``name`` (:mod:`coffea_sonic.zoo.trees`); ``version`` None: the newest."""
        from ..zoo.trees import tree_config_text, tree_file, tree_versions

        chosen = int(version) if version else tree_versions(name)[-1]
        return cls(name, tree_config_text(name), tree_file(name, chosen), chosen, device=device)

    def _info(self, config: model_config_pb2.ModelConfig):
        from ..core.tensors import ModelInfo, TensorInfo

        def tensors(declared) -> tuple:
            return tuple(TensorInfo(t.name, model_config_pb2.DataType.Name(t.data_type)
                                    .removeprefix("TYPE_"), tuple(t.dims)) for t in declared)

        return ModelInfo(name=self.name, versions=(str(self.version),), platform="fil",
                         max_batch_size=config.max_batch_size, inputs=tensors(config.input),
                         outputs=tensors(config.output))

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if set(inputs) != {"input__0"}:
            raise InputValidationError(
                f"tree model {self.name!r} takes one input, input__0 (FP32 [rows, "
                f"{self.features}]); got {sorted(inputs)}")
        rows = np.asarray(inputs["input__0"])
        if rows.ndim != 2 or rows.shape[1] != self.features:
            raise InputValidationError(
                f"tree model {self.name!r} input__0: expected [rows, {self.features}], got "
                f"{list(rows.shape)}")
        return self.forest.outputs(rows, self.widths)

    def __repr__(self) -> str:
        return (f"TreeEngine({self.name!r}, version {self.version}, {self.forest.library}, "
                f"{self.device})")

    def __getstate__(self) -> dict:
        return {"name": self.name, "config_text": self.config_text, "path": self.path,
                "version": self.version, "device": self.device}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["name"], state["config_text"], state["path"], state["version"],
                      device=state["device"])
