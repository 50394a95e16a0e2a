"""Tree models (XGBoost, LightGBM, Treelite) answering as Triton's FIL backend answers.

Self-contained (numpy and the tree library; nothing of coffea-sonic): the embedded server's FIL
backend runs a copy. What FIL does, and so this does, with examples: docs/internals/engines.md.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import numpy as np

logger = logging.getLogger(__name__)

#: FIL's model_type -> the file it loads by default.
MODEL_TYPES: dict[str, str] = {
    "xgboost": "xgboost.model", "xgboost_json": "xgboost.json", "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt", "treelite_checkpoint": "checkpoint.tl"}
#: FIL parameters that change speed only (current and removed names).
TUNING_KEYS = ("algo", "storage_type", "blocks_per_sm", "threads_per_tree",
               "use_experimental_optimizations", "transfer_threshold", "layout", "chunk_size",
               "cpu_nthread")
#: FIL parameters that change answers.
ANSWER_KEYS = ("model_type", "is_classifier", "output_class", "predict_proba", "threshold",
               "xgboost_allow_unknown_field")
#: The output FIL fills with SHAP values when the config declares it.
SHAP_OUTPUT = "treeshap_output"


class ForestError(ValueError):
    """A tree model, or its FIL parameters, that cannot be run as configured; says why."""


def _flag(parameters: Mapping[str, str], key: str, default: bool | None) -> bool | None:
    value = parameters.get(key)
    if value is None or value == "":
        return default
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ForestError(f"FIL parameter {key}={value!r} is not a boolean (\"true\" or \"false\")")


@dataclasses.dataclass(frozen=True)
class FilOptions:
    """The answer-changing FIL parameters of one model."""

    model_type: str
    is_classifier: bool
    predict_proba: bool = False
    threshold: float = 0.5
    allow_unknown_field: bool = False
    default_model_filename: str = ""

    @property
    def filename(self) -> str:
        """The file each version folder holds."""
        return self.default_model_filename or MODEL_TYPES[self.model_type]

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str],
                        default_model_filename: str = "") -> "FilOptions":
        """Read FIL's parameters (``{key: string value}``); :class:`ForestError` names a bad one."""
        model_type = str(parameters.get("model_type") or "xgboost")
        if model_type not in MODEL_TYPES:
            raise ForestError(f"FIL model_type {model_type!r} is not one FIL knows: "
                              f"{', '.join(MODEL_TYPES)}")
        is_classifier = _flag(parameters, "is_classifier", None)
        older = _flag(parameters, "output_class", None)
        if is_classifier is None:
            is_classifier = older
        if is_classifier is None:
            raise ForestError("FIL needs is_classifier (or its older name output_class): \"true\" "
                              "for a classifier, \"false\" for a regressor")
        try:
            threshold = float(parameters.get("threshold") or 0.5)
        except ValueError:
            raise ForestError(f"FIL parameter threshold={parameters['threshold']!r} is not a "
                              "number") from None
        return cls(model_type, bool(is_classifier),
                   bool(_flag(parameters, "predict_proba", False)), threshold,
                   bool(_flag(parameters, "xgboost_allow_unknown_field", False)),
                   default_model_filename)


def notes(parameters: Mapping[str, str]) -> list[str]:
    """What serving these FIL parameters here says about them (tuning keys, older names)."""
    said = []
    tuning = [f"{key}={parameters[key]}" for key in TUNING_KEYS if key in parameters]
    if tuning:
        said.append("FIL tuning parameters accepted; they change speed, not answers, and the "
                    "embedded server runs the tree library itself: " + ", ".join(tuning))
    if "output_class" in parameters and "is_classifier" not in parameters:
        said.append("output_class is FIL's older name of is_classifier (read as such)")
    unknown = sorted(set(parameters) - set(TUNING_KEYS) - set(ANSWER_KEYS))
    if unknown:
        said.append(f"parameters FIL does not read, ignored: {', '.join(unknown)}")
    return said


def fil_output(scores: np.ndarray, options: FilOptions, width: int) -> np.ndarray:
    """FIL's ``output__0`` from the model's per-class scores ``[rows, classes]``; ``width`` is
    the output's declared column count."""
    scores = np.asarray(scores, dtype=np.float32)
    if not options.is_classifier:
        return scores
    if options.predict_proba:
        if scores.shape[1] == 1 and width == 2:
            return np.concatenate([1.0 - scores, scores], axis=1)
        return scores
    if scores.shape[1] == 1:
        return (scores > np.float32(options.threshold)).astype(np.float32)
    return np.argmax(scores, axis=1).astype(np.float32)[:, None]


def _is_text_or_ubjson(head: bytes) -> bool:
    return head.lstrip()[:1] == b"{"


class Forest:
    """One tree model file, read with its own library; answers as FIL does.

    ``device``: ``"cpu"``, or ``"cuda:N"`` where XGBoost predicts on that GPU (other libraries run
    on the CPU, said at INFO).
    """

    def __init__(self, path: str, options: FilOptions, *, device: str = "cpu",
                 shap: bool = False) -> None:
        self.path, self.options, self.device = str(path), options, device
        with open(self.path, "rb") as handle:
            head = handle.read(64)
        if options.model_type.startswith("xgboost"):
            self.library, self.model = self._xgboost(head)
        elif options.model_type == "lightgbm":
            self.library, self.model = "lightgbm", _import("lightgbm", options).Booster(
                model_file=self.path)
        else:
            treelite = _import("treelite", options)
            self.library, self.model = "treelite", treelite.Model.deserialize(self.path)
        if shap and self.library == "treelite":
            raise ForestError(f"{self.path}: {SHAP_OUTPUT} needs XGBoost's or LightGBM's TreeSHAP, "
                              "and a Treelite checkpoint keeps neither; serve the model's "
                              "XGBoost/LightGBM file, or leave the output out")
        if device != "cpu" and self.library != "xgboost":
            logger.info("%s runs on the CPU: only XGBoost predicts on a GPU here", self.path)
        self.num_features = self._num_features()
        self.num_classes = self.scores(np.zeros((1, self.num_features), np.float32)).shape[1]

    def _xgboost(self, head: bytes) -> tuple[str, Any]:
        xgboost = _import("xgboost", self.options)
        if self.options.model_type == "xgboost_json" and not self.options.allow_unknown_field:
            _strict_json(self.path)
        if not _is_text_or_ubjson(head):
            return "treelite", _legacy_binary(self.path, xgboost.__version__, self.options)
        booster = xgboost.Booster()
        try:
            # from bytes, XGBoost tells JSON from UBJSON by the content (by the name otherwise,
            # and ".model" holds either, depending on the XGBoost that wrote it)
            with open(self.path, "rb") as handle:
                booster.load_model(bytearray(handle.read()))
        except xgboost.core.XGBoostError as error:
            raise ForestError(f"{self.path} is not a model XGBoost {xgboost.__version__} can read "
                              f"(model_type {self.options.model_type}): "
                              f"{str(error).splitlines()[0]}") from None
        if self.device != "cpu":
            booster.set_param({"device": self.device})
        return "xgboost", booster

    def _num_features(self) -> int:
        if self.library == "xgboost":
            return int(self.model.num_features())
        if self.library == "lightgbm":
            return int(self.model.num_feature())
        return int(self.model.num_feature)

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """The model's prediction per class, ``[rows, classes]`` float32 (probabilities for a
        classifier, as the library's ``predict_proba`` gives the positive class)."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if self.library == "xgboost":
            values = self.model.inplace_predict(rows)
        elif self.library == "lightgbm":
            values = self.model.predict(rows)
        else:
            import treelite.gtil

            values = treelite.gtil.predict(self.model, rows)
        return np.asarray(values, dtype=np.float32).reshape(len(rows), -1)

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        """SHAP values, ``[rows, classes * (features + 1)]`` float32, the bias last per class."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        if self.library == "xgboost":
            import xgboost

            values = self.model.predict(xgboost.DMatrix(rows), pred_contribs=True)
        else:
            values = self.model.predict(rows, pred_contrib=True)
        return np.asarray(values, dtype=np.float32).reshape(len(rows), -1)

    def outputs(self, rows: np.ndarray, widths: Mapping[str, int]) -> dict[str, np.ndarray]:
        """The outputs asked for (``{name: declared columns}``): ``output__0`` and, if asked,
        :data:`SHAP_OUTPUT`."""
        answers = {}
        for name, width in widths.items():
            if name == SHAP_OUTPUT:
                answers[name] = self.contributions(rows)
            else:
                answers[name] = fil_output(self.scores(rows), self.options, width)
        return answers


def _import(name: str, options: FilOptions) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ForestError(f"FIL model_type {options.model_type} is read with {name}, which this "
                          f"Python lacks: pip install 'coffea-sonic[trees]' (or pip install "
                          f"{name})") from None


def _strict_json(path: str) -> None:
    """Refuse an XGBoost JSON model with fields Treelite (FIL's reader) does not know."""
    try:
        import treelite.frontend
    except ImportError:
        return  # XGBoost's own reader skips unknown fields; FIL's strictness needs Treelite
    import json

    try:
        with open(path, "rb") as handle:
            json.load(handle)
    except ValueError as error:
        raise ForestError(f"{path} is not JSON (model_type xgboost_json): {error}") from None
    try:
        treelite.frontend.load_xgboost_model(path, format_choice="json", allow_unknown_field=False)
    except Exception:  # noqa: BLE001 - Treelite raises its own error types
        try:
            treelite.frontend.load_xgboost_model(path, format_choice="json",
                                                 allow_unknown_field=True)
        except Exception:  # noqa: BLE001 - not a question of fields: XGBoost's reader says why
            return
        raise ForestError(f"{path} has fields FIL's reader does not know, which FIL refuses: "
                          "set the parameter xgboost_allow_unknown_field to \"true\" to read "
                          "it anyway") from None


def _legacy_binary(path: str, xgboost_version: str, options: FilOptions) -> Any:
    """An XGBoost legacy binary model, which XGBoost >= 3 no longer reads: Treelite does."""
    try:
        import treelite.frontend
    except ImportError:
        raise ForestError(
            f"{path} is in XGBoost's legacy binary format, which XGBoost {xgboost_version} no "
            "longer reads; install treelite (pip install 'coffea-sonic[trees]') or convert it "
            "once with xgboost<2.1: Booster(model_file=...).save_model('xgboost.json') and set "
            "model_type xgboost_json") from None
    try:
        return treelite.frontend.load_xgboost_model_legacy_binary(path)
    except Exception as error:  # noqa: BLE001
        raise ForestError(f"{path} is neither JSON, UBJSON nor a legacy binary XGBoost model "
                          f"(model_type {options.model_type}): {str(error).splitlines()[0]}"
                          ) from None
