"""Triton FIL-backend repositories (XGBoost, LightGBM, Treelite) served by the embedded server as
they are written for NVIDIA's container: the Analysis Grand Challenge's own repository and models,
every FIL model_type, FIL's parameters, several versions, and the refusals, each answer compared
with the tree library's own prediction, on every transport from the server's side."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import lightgbm
import numpy as np
import pytest
import treelite
import xgboost

from coffea_sonic import LocalTritonServer, TritonModel
from coffea_sonic.errors import UnservableModelError
from coffea_sonic.server.standard import plan_repository
from helpers import assert_sent_over


DATA = Path(__file__).parent / "data"
AGC = DATA / "agc"
TRANSPORTS = ("grpc", "shm", "http")
FEATURES = 6


def fil_config(name: str, model_type: str, *, outputs: str = 'output__0 FP32 [1]',
               features: int = FEATURES, extra: str = "", **parameters: str) -> str:
    """A config.pbtxt as FIL's documentation writes one."""
    declared = []
    for spec in outputs.split(","):
        out_name, _, dims = spec.split()
        declared.append(f'{{ name: "{out_name}" data_type: TYPE_FP32 dims: {dims} }}')
    params = "\n".join(f'  {{ key: "{key}" value: {{ string_value: "{value}" }} }},'
                       for key, value in {"model_type": model_type, **parameters}.items())
    return textwrap.dedent(f"""\
        name: "{name}"
        backend: "fil"
        max_batch_size: 65536
        input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]
        output [ {", ".join(declared)} ]
        instance_group [{{ kind: KIND_CPU }}]
        parameters [
        {params.rstrip(",")}
        ]
        dynamic_batching {{ }}
        {extra}""")


def _write(repository: Path, name: str, config: str, files: dict[int, tuple[str, Path | bytes]]):
    model = repository / name
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    for version, (filename, content) in files.items():
        (model / str(version)).mkdir()
        target = model / str(version) / filename
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        else:
            target.write_bytes(content)


def _training_rows(seed: int, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(600, FEATURES)).astype(np.float32)
    score = rows[:, 0] + 0.5 * rows[:, 1] - rows[:, 2]
    labels = np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))
    return rows, labels


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    """Models trained here with each library, and their files in each FIL format."""
    folder = tmp_path_factory.mktemp("trees")
    rows, binary = _training_rows(1)
    _, three = _training_rows(2, classes=3)
    made = {
        "binary": xgboost.train({"objective": "binary:logistic", "max_depth": 3},
                                xgboost.DMatrix(rows, binary), 12),
        "multi": xgboost.train({"objective": "multi:softprob", "num_class": 3, "max_depth": 3},
                               xgboost.DMatrix(rows, three), 6),
        "regression": xgboost.train({"objective": "reg:squarederror", "max_depth": 3},
                                    xgboost.DMatrix(rows, rows[:, 0] * 2.0 + rows[:, 3]), 10),
        "lightgbm": lightgbm.train({"objective": "binary", "verbose": -1, "num_leaves": 7},
                                   lightgbm.Dataset(rows, binary), 12),
    }
    made["binary"].save_model(folder / "binary.json")
    made["binary"].save_model(folder / "binary.ubj")
    made["multi"].save_model(folder / "multi.ubj")
    made["regression"].save_model(folder / "regression.json")
    # what XGBoost >= 2.1 writes to a ".model" name: UBJSON
    with pytest.warns(UserWarning, match="UBJSON"):
        made["binary"].save_model(folder / "binary_ubj.model")
    made["lightgbm"].save_model(folder / "model.txt")
    treelite.frontend.load_xgboost_model(str(folder / "binary.json")).serialize(
        str(folder / "checkpoint.tl"))
    return folder, made


@pytest.fixture(scope="module")
def repository(tmp_path_factory, trees):
    folder, _ = trees
    repo = tmp_path_factory.mktemp("fil_repository")
    _write(repo, "reconstruction_bdt_xgb", _agc_config(), {
        1: ("xgboost.model", AGC / "model_odd.json"), 2: ("xgboost.model", AGC / "model_even.json")})
    # the same repository as XGBoost >= 2.1 writes it (UBJSON in xgboost.model), and with the JSON
    # files under FIL's xgboost_json name and type
    ubjson = {}
    for version, source in ((1, "model_odd.json"), (2, "model_even.json")):
        xgboost.Booster(model_file=str(AGC / source)).save_model(folder / f"agc_{version}.ubj")
        ubjson[version] = ("xgboost.model", folder / f"agc_{version}.ubj")
    _write(repo, "agc_ubjson", _agc_config().replace("reconstruction_bdt_xgb", "agc_ubjson"),
           ubjson)
    _write(repo, "agc_json", _agc_config().replace("reconstruction_bdt_xgb", "agc_json").replace(
        'string_value: "xgboost" }', 'string_value: "xgboost_json" }'), {
        1: ("xgboost.json", AGC / "model_odd.json"), 2: ("xgboost.json", AGC / "model_even.json")})
    _write(repo, "xgb_json", fil_config("xgb_json", "xgboost_json", is_classifier="true",
                                        predict_proba="true"),
           {1: ("xgboost.json", folder / "binary.json")})
    _write(repo, "xgb_ubj_multi", fil_config("xgb_ubj_multi", "xgboost_ubj",
                                             outputs="output__0 FP32 [3]", is_classifier="true",
                                             predict_proba="true"),
           {1: ("xgboost.ubj", folder / "multi.ubj")})
    _write(repo, "xgb_multi_class", fil_config("xgb_multi_class", "xgboost_ubj",
                                               is_classifier="true"),
           {1: ("xgboost.ubj", folder / "multi.ubj")})
    _write(repo, "xgb_model_is_ubjson", fil_config("xgb_model_is_ubjson", "xgboost",
                                                   outputs="output__0 FP32 [2]",
                                                   is_classifier="true", predict_proba="true"),
           {1: ("xgboost.model", folder / "binary_ubj.model")})
    _write(repo, "xgb_legacy", fil_config("xgb_legacy", "xgboost", outputs="output__0 FP32 [2]",
                                          output_class="true", predict_proba="true"),
           {1: ("xgboost.model", DATA / "fil" / "xgboost_1.7.6_legacy.model")})
    _write(repo, "xgb_regression", fil_config("xgb_regression", "xgboost_json",
                                              is_classifier="false"),
           {1: ("xgboost.json", folder / "regression.json")})
    _write(repo, "lgb_threshold", fil_config("lgb_threshold", "lightgbm", is_classifier="true",
                                             threshold="0.3"),
           {1: ("model.txt", folder / "model.txt")})
    _write(repo, "treelite", fil_config("treelite", "treelite_checkpoint", is_classifier="true",
                                        predict_proba="true"),
           {1: ("checkpoint.tl", folder / "checkpoint.tl")})
    _write(repo, "xgb_shap", fil_config(
        "xgb_shap", "xgboost_json", outputs=f"output__0 FP32 [1], treeshap_output FP32 "
                                            f"[{FEATURES + 1}]",
        is_classifier="true", predict_proba="true",
        extra='default_model_filename: "tagger.json"'),
        {1: ("tagger.json", folder / "binary.json")})
    return repo


def _agc_config() -> str:
    """The config the AGC's write_triton_config printed at the pinned commit (tests/data/agc)."""
    return textwrap.dedent("""\
        name: "reconstruction_bdt_xgb"
        backend: "fil"
        max_batch_size: 50000000
        input [
         {
            name: "input__0"
            data_type: TYPE_FP32
            dims: [ 20 ]
         }
        ]
        output [
         {
            name: "output__0"
            data_type: TYPE_FP32
            dims: [ 2 ]
         }
        ]
        instance_group [{ kind: KIND_GPU }]
        parameters [
          {
            key: "model_type"
            value: { string_value: "xgboost" }
          },
          {
            key: "predict_proba"
            value: { string_value: "true" }
          },
          {
            key: "output_class"
            value: { string_value: "true" }
          },
          {
            key: "threshold"
            value: { string_value: "0.5" }
          },
          {
            key: "algo"
            value: { string_value: "ALGO_AUTO" }
          },
          {
            key: "storage_type"
            value: { string_value: "AUTO" }
          },
          {
            key: "blocks_per_sm"
            value: { string_value: "0" }
          }
        ]
        version_policy: { all { }}
        dynamic_batching { }
        """)


@pytest.fixture(scope="module")
def server(repository):
    with LocalTritonServer(repository=repository, device="cpu") as running:
        yield running


def _url(server, transport: str, model: str, version: int | None = None) -> str:
    suffix = f"/{version}" if version is not None else ""
    if transport == "http":
        return f"triton+http://{server.http_address}/{model}{suffix}"
    return f"triton+grpc://{server.grpc_address}/{model}{suffix}"


def _ask(server, transport: str, model: str, rows: np.ndarray,
         version: int | None = None) -> dict[str, np.ndarray]:
    client = TritonModel(_url(server, transport, model, version),
                         transport="auto" if transport == "http" else transport, retry={"max_attempts": 1})
    return assert_sent_over(transport, server, lambda: client({"input__0": rows}))


def _rows(seed: int, features: int = FEATURES, count: int = 3000) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, features)).astype(np.float32)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_agc_repository_is_served_as_published_each_version_answering_like_its_own_file(
        server, transport):
    rows = _rows(3, features=20, count=2000)
    for version, trained_on in ((1, "model_odd.json"), (2, "model_even.json")):
        booster = xgboost.Booster(model_file=str(AGC / trained_on))
        positive = booster.inplace_predict(rows)  # what XGBClassifier.predict_proba[:, 1] gives
        for model in ("reconstruction_bdt_xgb", "agc_ubjson", "agc_json"):
            answer = _ask(server, transport, model, rows, version)["output__0"]
            assert answer.shape == (2000, 2) and answer.dtype == np.float32, model
            np.testing.assert_allclose(answer[:, 1], positive, rtol=0, atol=1e-6, err_msg=model)
            np.testing.assert_allclose(answer[:, 0], 1.0 - positive, rtol=0, atol=1e-6,
                                       err_msg=model)
    odd, even = (_ask(server, "grpc", "reconstruction_bdt_xgb", rows[:50], v)["output__0"]
                 for v in (1, 2))
    assert np.abs(odd - even).max() > 0.05, "the two versions must be different models"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_fil_model_type_answers_like_its_library(server, trees, transport):
    _, made = trees
    rows = _rows(4)
    binary = made["binary"].inplace_predict(rows)

    def answer(model: str) -> np.ndarray:
        return _ask(server, transport, model, rows)["output__0"]

    np.testing.assert_allclose(answer("xgb_json")[:, 0], binary, atol=1e-6)
    np.testing.assert_allclose(answer("xgb_model_is_ubjson")[:, 1], binary, atol=1e-6)
    np.testing.assert_allclose(answer("treelite")[:, 0], binary, atol=1e-6)
    multi = made["multi"].inplace_predict(rows)
    np.testing.assert_allclose(answer("xgb_ubj_multi"), multi, atol=1e-6)
    np.testing.assert_array_equal(answer("xgb_multi_class")[:, 0], np.argmax(multi, axis=1))
    np.testing.assert_allclose(answer("xgb_regression")[:, 0],
                               made["regression"].inplace_predict(rows), rtol=1e-6, atol=1e-5)
    positive = made["lightgbm"].predict(rows)
    classes = answer("lgb_threshold")[:, 0]
    np.testing.assert_array_equal(classes, (positive > 0.3).astype(np.float32))
    assert 0 < classes.mean() < 1 and ((positive > 0.3) != (positive > 0.5)).any()


def test_a_legacy_binary_xgboost_model_answers_as_the_xgboost_that_wrote_it(server):
    expected = np.load(DATA / "fil" / "xgboost_1.7.6_legacy_expected.npz")
    answer = _ask(server, "grpc", "xgb_legacy", expected["rows"])["output__0"]
    np.testing.assert_allclose(answer[:, 1], expected["positive"], atol=1e-6)
    with pytest.raises(xgboost.core.XGBoostError):  # why Treelite reads it here
        xgboost.Booster(model_file=str(DATA / "fil" / "xgboost_1.7.6_legacy.model"))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_treeshap_output_holds_the_library_s_shap_values_from_a_renamed_file(
        server, trees, transport):
    _, made = trees
    rows = _rows(5, count=500)
    answers = _ask(server, transport, "xgb_shap", rows)
    contributions = made["binary"].predict(xgboost.DMatrix(rows), pred_contribs=True)
    np.testing.assert_allclose(answers["treeshap_output"], contributions, atol=1e-5)
    margin = made["binary"].predict(xgboost.DMatrix(rows), output_margin=True)
    np.testing.assert_allclose(answers["treeshap_output"].sum(axis=1), margin, atol=1e-4)
    np.testing.assert_allclose(answers["output__0"][:, 0], made["binary"].inplace_predict(rows),
                               atol=1e-6)


def test_the_plan_says_what_it_accepted_and_serves_gpu_instances_on_the_cpu(repository):
    servable, refusals = plan_repository(repository, device="cpu")
    assert refusals == []
    agc = {model.name: model for model in servable}["reconstruction_bdt_xgb"]
    assert agc.backend == "fil" and agc.versions == (1, 2) and agc.adapted
    said = " ".join(agc.notes)
    assert "algo=ALGO_AUTO, storage_type=AUTO, blocks_per_sm=0" in said
    assert "output_class is FIL's older name of is_classifier" in said
    assert "KIND_GPU served as KIND_CPU" in said


def _refusal(tmp_path: Path, config: str, files: dict[int, tuple[str, Path | bytes]]) -> str:
    repo = tmp_path / "repo"
    _write(repo, "bdt", config, files)
    servable, refusals = plan_repository(repo)
    assert servable == [] and len(refusals) == 1, refusals
    return refusals[0].describe()


@pytest.mark.parametrize("case, config_args, filename, says", [
    ("unknown model_type", ("sklearn_pickle",), "xgboost.model",
     "FIL model_type 'sklearn_pickle' is not one FIL knows"),
    ("no is_classifier", ("xgboost_json",), "xgboost.json", "FIL needs is_classifier"),
    ("file of another name", ("xgboost_json",), "model.json", "1/xgboost.json does not exist"),
    ("not a boolean", ("xgboost_json",), "xgboost.json", "predict_proba='sure' is not a boolean"),
])
def test_a_fil_config_fil_would_refuse_is_refused_before_the_server_starts(
        tmp_path, trees, case, config_args, filename, says):
    folder, _ = trees
    parameters = {} if case == "no is_classifier" else {"is_classifier": "true"}
    if case == "not a boolean":
        parameters["predict_proba"] = "sure"
    text = _refusal(tmp_path, fil_config("bdt", *config_args, **parameters),
                    {1: (filename, folder / "binary.json")})
    assert says in text, text


@pytest.mark.parametrize("outputs, features, says", [
    ("output__0 FP32 [3]", FEATURES, "output__0 dims [3] but the model gives class probabilities "
                                     "in 1 or 2 column(s)"),
    ("output__0 FP32 [1]", 20, f"input__0 dims [20] but the model reads {FEATURES} features"),
    ("output__0 FP32 [1], treeshap_output FP32 [5]", FEATURES,
     f"treeshap_output dims [5] but the model gives {FEATURES + 1} SHAP values"),
])
def test_a_config_that_contradicts_its_trees_is_refused_naming_the_fix(
        tmp_path, trees, outputs, features, says):
    folder, _ = trees
    text = _refusal(tmp_path, fil_config("bdt", "xgboost_json", outputs=outputs, features=features,
                                         is_classifier="true", predict_proba="true"),
                    {1: ("xgboost.json", folder / "binary.json")})
    assert says in text, text


def test_unknown_json_fields_are_refused_as_fil_refuses_them_unless_allowed(tmp_path, trees):
    folder, _ = trees
    document = json.loads((folder / "binary.json").read_text())
    document["learner"]["written_by_a_newer_xgboost"] = 1
    unknown = json.dumps(document).encode()
    text = _refusal(tmp_path / "strict", fil_config("bdt", "xgboost_json", is_classifier="true"),
                    {1: ("xgboost.json", unknown)})
    assert "xgboost_allow_unknown_field" in text, text
    repo = tmp_path / "allowed"
    _write(repo, "bdt", fil_config("bdt", "xgboost_json", is_classifier="true",
                                   xgboost_allow_unknown_field="true"),
           {1: ("xgboost.json", unknown)})
    assert [m.name for m in plan_repository(repo)[0]] == ["bdt"]


def test_a_treelite_checkpoint_with_treeshap_and_a_broken_file_are_refused(tmp_path, trees):
    folder, _ = trees
    text = _refusal(tmp_path / "shap", fil_config(
        "bdt", "treelite_checkpoint", outputs=f"output__0 FP32 [1], treeshap_output FP32 "
                                              f"[{FEATURES + 1}]", is_classifier="true"),
        {1: ("checkpoint.tl", folder / "checkpoint.tl")})
    assert "a Treelite checkpoint keeps neither" in text, text
    text = _refusal(tmp_path / "broken", fil_config("bdt", "lightgbm", is_classifier="true"),
                    {1: ("model.txt", b"this is not a LightGBM model\n")})
    assert "model.txt is not a lightgbm model its library can read" in text, text


def test_an_unservable_fil_model_stops_the_server_start_with_every_reason(tmp_path, trees):
    folder, _ = trees
    repo = tmp_path / "repo"
    _write(repo, "bdt", fil_config("bdt", "xgboost_json", is_classifier="true",
                                   extra="version_policy: { all { }}"),
           {1: ("xgboost.json", folder / "binary.json"), 2: ("xgboost.json", b"{ not json")})
    with pytest.raises(UnservableModelError) as refused:
        LocalTritonServer(repository=repo, device="cpu").start()
    assert "model 'bdt' version 2: platform fil: " in str(refused.value)
    assert "2/xgboost.json is not JSON (model_type xgboost_json)" in str(refused.value)
    with LocalTritonServer(repository=repo, device="cpu", skip_unservable=True) as running:
        rows = _rows(6, count=10)
        answer = TritonModel(running.url("bdt", 1), retry={"max_attempts": 1})({"input__0": rows})["output__0"]
        assert answer.shape == (10, 1) and set(np.unique(answer)) <= {0.0, 1.0}


@pytest.mark.gpu
def test_a_gpu_server_predicts_the_agc_models_with_xgboost_on_cuda(tmp_path):
    from coffea_sonic.server.launcher import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    repo = tmp_path / "repo"
    _write(repo, "reconstruction_bdt_xgb", _agc_config(), {
        1: ("xgboost.model", AGC / "model_odd.json"), 2: ("xgboost.model", AGC / "model_even.json")})
    rows = _rows(7, features=20, count=20000)
    with LocalTritonServer(repository=repo, device="gpu") as running:
        answer = TritonModel(running.url("reconstruction_bdt_xgb", 2), retry={"max_attempts": 1})(
            {"input__0": rows})["output__0"]
        log = Path(running.log_path).read_text()
    assert "runs on cuda:0" in log
    positive = xgboost.Booster(model_file=str(AGC / "model_even.json")).inplace_predict(rows)
    np.testing.assert_allclose(answer[:, 1], positive, atol=1e-5)


def test_models_add_writes_a_fil_repository_for_xgboost_and_lightgbm_files_that_serves(
        tmp_path, trees):
    import subprocess
    import sys

    folder, made = trees
    repo = tmp_path / "repo"
    for file, name in ((AGC / "model_even.json", "agc_even"), (folder / "model.txt", "lgb"),
                       (folder / "multi.ubj", "multi")):
        done = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "models", "add", str(file),
                               "--name", name, "-o", str(repo)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "(fil, max_batch_size 1048576, 1 x CPU)" in done.stdout, done.stdout
    validated = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "models", "validate",
                                str(repo)], capture_output=True, text=True, timeout=120)
    assert validated.returncode == 0 and "3 model(s)" in validated.stdout, validated.stdout
    rows = _rows(8, features=20, count=100)
    with LocalTritonServer(repository=repo, device="cpu") as running:
        agc = TritonModel(running.url("agc_even"), retry={"max_attempts": 1})
        answer = agc({"input__0": rows})["output__0"]
        multi = TritonModel(running.url("multi"), retry={"max_attempts": 1})(
            {"input__0": rows[:, :FEATURES]})["output__0"]
    booster = xgboost.Booster(model_file=str(AGC / "model_even.json"))
    np.testing.assert_allclose(answer[:, 1], booster.inplace_predict(rows), atol=1e-6)
    np.testing.assert_allclose(multi, made["multi"].inplace_predict(rows[:, :FEATURES]), atol=1e-6)


def test_models_validate_reports_a_fil_model_s_problems_as_the_official_container_would(
        tmp_path, trees):
    from coffea_sonic.server.model_check import validate_repository

    folder, _ = trees
    repo = tmp_path / "repo"
    _write(repo, "bdt", fil_config("bdt", "xgboost_json", outputs="output__0 FP32 [4]",
                                   is_classifier="true", predict_proba="true",
                                   extra="version_policy: { all { }}"),
           {1: ("xgboost.json", folder / "binary.json"), 2: ("model.json", folder / "binary.json")})
    problems = [p.describe() for p in validate_repository(repo).problems]
    assert problems == [
        "bdt version 1: FIL model: output__0 dims [4] but the model gives class "
        "probabilities in 1 or 2 column(s): dims [2] (the official container's FIL backend "
        "refuses it too)",
        "bdt version 2: model file: expected 2/xgboost.json, found only ['model.json'] (put the "
        "model file there, or set default_model_filename)"], problems


def test_the_agc_s_own_client_code_path_gets_what_local_xgboost_gives(server):
    """``get_inference_results_triton`` at the pinned AGC commit, against our server: the model's
    metadata, InferInput with the served dtype, model_version per parity, column 1."""
    import tritonclient.grpc as grpcclient

    rows = _rows(9, features=20, count=3000).astype(np.float64)  # the AGC's features are float64
    even = np.arange(len(rows)) % 2 == 0
    client = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        metadata = client.get_model_metadata("reconstruction_bdt_xgb", "2")
        input_name, dtype = metadata.inputs[0].name, metadata.inputs[0].datatype
        output_name = metadata.outputs[0].name
        assert (input_name, dtype, output_name) == ("input__0", "FP32", "output__0")
        results = np.zeros(len(rows))
        for mask, version in ((even, "2"), (~even, "1")):
            inputs = [grpcclient.InferInput(input_name, rows[mask].shape, dtype)]
            inputs[0].set_data_from_numpy(rows[mask].astype(np.float32))
            results[mask] = client.infer(model_name="reconstruction_bdt_xgb", model_version=version,
                                         inputs=inputs,
                                         outputs=[grpcclient.InferRequestedOutput(output_name)]
                                         ).as_numpy(output_name)[:, 1]
    finally:
        client.close()
    for mask, source in ((even, "model_even.json"), (~even, "model_odd.json")):
        local = xgboost.Booster(model_file=str(AGC / source)).inplace_predict(
            rows[mask].astype(np.float32))
        np.testing.assert_allclose(results[mask], local, atol=1e-6)
