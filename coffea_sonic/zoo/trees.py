"""The zoo's tree models: served by Triton's FIL backend, run in-process by the tree engine.

The models and how they are written, with an example: docs/internals/zoo.md, "Tree models".
"""

from __future__ import annotations

import dataclasses
import shutil
from importlib import resources
from pathlib import Path

from ..errors import ModelNotFoundError

__all__ = ["TreeModel", "TREE_MODELS", "declared_tree_info", "tree_config_text", "tree_file",
           "tree_names", "tree_versions", "write_tree_model"]


@dataclasses.dataclass(frozen=True)
class TreeModel:
    """A zoo tree model: its files per version and what its FIL config declares."""

    name: str
    files: dict[int, str]
    features: int
    columns: int
    model_type: str = "xgboost_json"
    #: FIL's default file of ``model_type``
    filename: str = "xgboost.json"
    #: FIL parameters besides model_type (string values, as config.pbtxt holds them)
    parameters: tuple[tuple[str, str], ...] = (("is_classifier", "true"),
                                               ("predict_proba", "true"), ("threshold", "0.5"))
    #: as the AGC writes it: requests of any size the client picks
    max_batch_size: int = 50_000_000


TREE_MODELS: dict[str, TreeModel] = {
    "reconstruction_bdt_xgb": TreeModel("reconstruction_bdt_xgb",
                                        {1: "agc_bdt_odd.json", 2: "agc_bdt_even.json"},
                                        features=20, columns=2),
}


def tree_names() -> list[str]:
    """Names of the zoo's tree models, sorted."""
    return sorted(TREE_MODELS)


def _model(name: str) -> TreeModel:
    try:
        return TREE_MODELS[name]
    except KeyError:
        raise ModelNotFoundError(f"the zoo has no tree model {name!r}; it has "
                                 f"{', '.join(tree_names())}") from None


def tree_versions(name: str) -> tuple[int, ...]:
    """The versions of zoo tree model ``name``, ascending."""
    return tuple(sorted(_model(name).files))


def tree_file(name: str, version: int) -> Path:
    """The file of one version of zoo tree model ``name``."""
    model = _model(name)
    if version not in model.files:
        raise ModelNotFoundError(f"zoo tree model {name!r} has versions "
                                 f"{list(tree_versions(name))}, not {version}")
    return Path(str(resources.files("coffea_sonic.zoo") / model.files[version]))


def tree_config_text(name: str, device: str = "cpu") -> str:
    """The config.pbtxt of zoo tree model ``name`` (Triton's FIL backend), every version served.

    >>> 'backend: "fil"' in tree_config_text("reconstruction_bdt_xgb")
    True
    """
    model = _model(name)
    parameters = (("model_type", model.model_type), *model.parameters)
    listed = ",\n".join(f'  {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
                        for key, value in parameters)
    kind = "KIND_GPU" if device == "gpu" else "KIND_CPU"
    return (f'name: "{name}"\nbackend: "fil"\nmax_batch_size: {model.max_batch_size}\n'
            f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {model.features} ] }} ]\n'
            f'output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {model.columns} ] }} ]\n'
            f"instance_group [{{ kind: {kind} }}]\nparameters [\n{listed}\n]\n"
            "version_policy: { all { }}\ndynamic_batching { }\n")


def write_tree_model(repository: str | Path, name: str, *, device: str = "cpu",
                     link: bool = False) -> Path:
    """Write zoo tree model ``name`` into ``repository`` (its folder made anew); return the folder.

    >>> import tempfile
    >>> folder = write_tree_model(tempfile.mkdtemp(), "reconstruction_bdt_xgb")
    >>> sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    ['1/xgboost.json', '2/xgboost.json', 'config.pbtxt']
    """
    model = _model(name)
    folder = Path(repository) / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "config.pbtxt").write_text(tree_config_text(name, device))
    for version in model.files:
        (folder / str(version)).mkdir()
        target = folder / str(version) / model.filename
        if link:
            target.symlink_to(tree_file(name, version))
        else:
            shutil.copyfile(tree_file(name, version), target)
    return folder


def declared_tree_info(name: str):
    """What a server serving zoo tree model ``name`` declares (a ModelInfo), or None."""
    from ..core.tensors import ModelInfo, TensorInfo

    model = TREE_MODELS.get(name)
    if model is None:
        return None
    return ModelInfo(name=name, versions=tuple(str(v) for v in tree_versions(name)),
                     platform="fil", max_batch_size=model.max_batch_size,
                     inputs=(TensorInfo("input__0", "FP32", (model.features,)),),
                     outputs=(TensorInfo("output__0", "FP32", (model.columns,)),))
