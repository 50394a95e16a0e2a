"""Triton FIL-backend models (XGBoost, LightGBM, Treelite): whether the embedded server can serve a
version, and what it says about the config.

How it works: docs/internals/standard-repositories.md, "Tree models (FIL)" (with an example).
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2

from ..engines.forest import (MODEL_TYPES, SHAP_OUTPUT, FilOptions, Forest, ForestError,
                              notes)

__all__ = ["fil_filename", "fil_notes", "fil_version_problem"]


def _parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def fil_filename(config: model_config_pb2.ModelConfig) -> str:
    """The file a version folder holds (``default_model_filename``, else FIL's default)."""
    model_type = _parameters(config).get("model_type") or "xgboost"
    return config.default_model_filename or MODEL_TYPES.get(model_type, "xgboost.model")


def fil_notes(config: model_config_pb2.ModelConfig) -> list[str]:
    """What serving this config here says: tuning keys accepted, older names, ignored keys."""
    return notes(_parameters(config))


def _declared(config: model_config_pb2.ModelConfig, kind: str) -> dict[str, list[int]]:
    return {tensor.name: list(tensor.dims) for tensor in getattr(config, kind)}


def _tensor_problem(config: model_config_pb2.ModelConfig, forest: Forest) -> str | None:
    inputs, outputs = _declared(config, "input"), _declared(config, "output")
    if list(inputs) != ["input__0"]:
        return (f"FIL takes one input named input__0 (FP32, dims [features]); config.pbtxt "
                f"declares {list(inputs) or 'none'}")
    if "output__0" not in outputs or set(outputs) - {"output__0", SHAP_OUTPUT}:
        return (f"FIL gives output__0 (and optionally {SHAP_OUTPUT}); config.pbtxt declares "
                f"{list(outputs) or 'none'}")
    for tensor in (*config.input, *config.output):
        if tensor.data_type != model_config_pb2.TYPE_FP32:
            return (f"{tensor.name} is {model_config_pb2.DataType.Name(tensor.data_type)}; FIL "
                    "reads and writes TYPE_FP32 only")
    if inputs["input__0"] != [forest.num_features]:
        return (f"input__0 dims {inputs['input__0']} but the model reads {forest.num_features} "
                f"features: dims [{forest.num_features}]")
    options, classes = forest.options, forest.num_classes
    if not options.is_classifier:
        allowed = [classes]
    elif options.predict_proba:
        allowed = [1, 2] if classes == 1 else [classes]
    else:
        allowed = [1]
    if outputs["output__0"] not in [[width] for width in allowed]:
        what = ("class probabilities" if options.is_classifier and options.predict_proba
                else "the class" if options.is_classifier else "predictions")
        return (f"output__0 dims {outputs['output__0']} but the model gives {what} in "
                f"{' or '.join(str(w) for w in allowed)} column(s): dims [{allowed[-1]}]")
    if SHAP_OUTPUT in outputs:
        width = classes * (forest.num_features + 1)
        if outputs[SHAP_OUTPUT] != [width]:
            return (f"{SHAP_OUTPUT} dims {outputs[SHAP_OUTPUT]} but the model gives {width} SHAP "
                    f"values per row (classes x (features + 1)): dims [{width}]")
    return None


def fil_version_problem(config: model_config_pb2.ModelConfig | None, model_dir: Path,
                        version: int) -> str | None:
    """Why the embedded server cannot serve this version of a FIL model (None if it can)."""
    if config is None:
        return ("no config.pbtxt; a FIL model needs one (backend \"fil\", model_type, "
                "is_classifier, input__0, output__0): `coffea-sonic models add` writes it")
    try:
        options = FilOptions.from_parameters(_parameters(config), config.default_model_filename)
    except ForestError as error:
        return str(error)
    path = model_dir / str(version) / options.filename
    if not path.exists():
        return (f"{path} does not exist (FIL model_type {options.model_type} loads "
                f"{options.filename}{' as default_model_filename says' if config.default_model_filename else ''})")
    try:
        forest = Forest(str(path), options, shap=SHAP_OUTPUT in _declared(config, "output"))
    except ForestError as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - a library's own error on a broken file
        return (f"{path} is not a {options.model_type} model its library can read: "
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    return _tensor_problem(config, forest)


#: What ``coffea-sonic models add`` reads as a tree model, by suffix.
TREE_SUFFIXES: dict[str, str] = {".json": "xgboost_json", ".ubj": "xgboost_ubj",
                                 ".model": "xgboost", ".txt": "lightgbm",
                                 ".tl": "treelite_checkpoint"}
#: ``max_batch_size`` written for a tree model: FIL's documentation's example (trees are cheap per
#: row; the request size is the client's choice).
TREE_MAX_BATCH_SIZE = 1048576
#: Objectives (XGBoost, LightGBM) and Treelite postprocessors of classifiers.
_CLASSIFYING = ("binary", "multi", "sigmoid", "softmax", "multiclass")


def tree_model_type(path: Path) -> str | None:
    """FIL's model_type for a model file (None: not a tree model): by suffix, and for ``.txt``
    only a LightGBM model (its first line is ``tree``).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "notes.txt").write_text("hello"); _ = (folder / "b.txt").write_text("tree\\n")
    >>> tree_model_type(folder / "b.txt"), tree_model_type(folder / "notes.txt")
    ('lightgbm', None)
    """
    model_type = TREE_SUFFIXES.get(path.suffix.lower())
    if model_type == "lightgbm":
        with open(path, "rb") as handle:
            return model_type if handle.readline().strip() == b"tree" else None
    return model_type


def _is_classifier(forest: Forest) -> bool:
    import json

    if forest.library == "xgboost":
        objective = json.loads(forest.model.save_config())["learner"]["objective"]["name"]
    elif forest.library == "lightgbm":
        objective = str(forest.model.dump_model().get("objective", ""))
    else:
        objective = str(json.loads(forest.model.dump_as_json(pretty_print=False))
                        .get("postprocessor", ""))
    return objective.startswith(_CLASSIFYING)


def tree_config(source: Path, name: str, notes: list[str], *, max_batch_size: int | None,
                instances: int, device: str) -> model_config_pb2.ModelConfig:
    """The FIL config.pbtxt for tree model file ``source``: input__0 of its features, output__0
    of its class probabilities (a binary classifier: ``[1 - p, p]``, as the AGC serves one) or its
    prediction, on the CPU or a GPU."""
    model_type = tree_model_type(source)
    if model_type is None:
        raise ForestError(f"{source} is not a tree model file ({', '.join(TREE_SUFFIXES)})")
    probe = Forest(str(source), FilOptions(model_type, is_classifier=False))
    classifier = _is_classifier(probe)
    width = (2 if probe.num_classes == 1 else probe.num_classes) if classifier else probe.num_classes
    config = model_config_pb2.ModelConfig(
        name=name, backend="fil",
        max_batch_size=TREE_MAX_BATCH_SIZE if max_batch_size is None else max_batch_size)
    config.input.add(name="input__0", data_type=model_config_pb2.TYPE_FP32,
                     dims=[probe.num_features])
    config.output.add(name="output__0", data_type=model_config_pb2.TYPE_FP32, dims=[width])
    group = config.instance_group.add(count=instances)
    group.kind = group.KIND_GPU if device == "gpu" else group.KIND_CPU
    if config.max_batch_size > 0:
        config.dynamic_batching.SetInParent()
    parameters = {"model_type": model_type, "is_classifier": str(classifier).lower()}
    if classifier:
        parameters["predict_proba"] = "true"
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    notes.append(f"a {probe.library} {'classifier' if classifier else 'regressor'} of "
                 f"{probe.num_features} features: output__0 holds "
                 + (f"the {width} class probabilities" if classifier else "its prediction")
                 + " (Triton's FIL backend; set predict_proba false in config.pbtxt for class "
                 "indices)" * classifier)
    return config
