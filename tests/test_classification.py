"""``TritonModel(..., classification=K)``: the server's top-K labels (Triton's classification
extension) over every transport, checked against onnxruntime's scores of the same ONNX model and
the repository's own label file; wrong K or outputs refused before anything is sent."""

from __future__ import annotations

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.classification import parse_classes
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.server import LocalTritonServer
from experiment_repository import LABELS, experiment_repository, particle_inputs
from helpers import assert_sent_over

torch = pytest.importorskip("torch")  # the repository's models are exported by torch
onnxruntime = pytest.importorskip("onnxruntime")

ROWS = 450  # above pnet_onnx's max_batch_size of 200: several requests per call


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = experiment_repository(tmp_path_factory.mktemp("classified") / "models")
    inputs = particle_inputs(ROWS, seed=5)
    session = onnxruntime.InferenceSession(str(repository / "pnet_onnx" / "1" / "model.onnx"))
    scores = session.run(None, {"pf_points": inputs["points"],
                                "pf_features": inputs["features"]})[0]
    with LocalTritonServer(repository=repository, device="cpu").start() as server:
        yield server, {"pf_points": inputs["points"], "pf_features": inputs["features"]}, scores


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_top_k_labels_come_back_ranked_with_their_scores_on_every_transport(served, transport):
    server, feed, scores = served
    url = (f"triton+http://{server.http_address}/pnet_onnx" if transport == "http"
           else server.url("pnet_onnx"))
    model = TritonModel(url, transport=transport, classification=2, fallback="off")
    try:
        if transport == "http":
            answer = model(feed)
        else:
            answer = assert_sent_over(transport, server.grpc_address, lambda: model(feed))
        assert model.stats.requests >= 3 and model.transport_kind == transport
    finally:
        model.close()
    top = answer["softmax"]
    assert top.shape == (ROWS, 2) and top.dtype == object
    values, indices, labels = parse_classes(top)
    best = np.argsort(-scores, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(indices, best)
    np.testing.assert_allclose(values, np.take_along_axis(scores, best, axis=1), atol=1e-5)
    assert labels.tolist() == [[LABELS[i] for i in row] for row in best]


def test_classification_of_one_output_leaves_the_others_as_scores(served):
    server, _, _ = served
    features = np.random.default_rng(2).normal(size=(30, 6)).astype(np.float32)
    model = TritonModel(server.url("mass_reg"), classification={"mass": 1}, fallback="off")
    try:
        (values, indices, labels) = parse_classes(model({"features": features})["mass"])
        plain = TritonModel(server.url("mass_reg"), fallback="off")({"features": features})
    finally:
        model.close()
    np.testing.assert_allclose(values[:, 0], plain["mass"][:, 0], atol=1e-5)
    assert set(indices[:, 0]) == {0} and set(labels[:, 0]) == {"mass"}


@pytest.mark.parametrize("choice, complaint", [
    (4, r"'pnet_onnx' output 'softmax'.*classification=4.*\(softmax FP32\[3\]: 3\); use at most 3"),
    ({"scores": 2}, r"'pnet_onnx'.*outputs \['scores'\].*its outputs: \['softmax'\]"),
])
def test_a_classification_the_model_cannot_give_is_refused_before_sending(served, choice,
                                                                          complaint):
    server, feed, _ = served
    model = TritonModel(server.url("pnet_onnx"), classification=choice, fallback="off")
    try:
        with pytest.raises(ConfigurationError, match=complaint):
            model(feed)
        assert model.stats.requests == 0
    finally:
        model.close()


@pytest.mark.parametrize("options, complaint", [
    ({"classification": -1}, "whole number of classes >= 1"),
    ({"classification": {"softmax": 1.5}}, "for output 'softmax'"),
    ({"classification": 2, "fallback": "cpu"}, "fallback='off' and shadow=0"),
])
def test_classification_options_are_checked_when_the_model_is_made(options, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        TritonModel("triton+grpc://127.0.0.1:1/pnet_onnx", **options)
