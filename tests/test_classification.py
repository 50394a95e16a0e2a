"""``TritonModel(..., classification=K)``: the server's top-K labels (Triton's classification
extension) over every transport, checked against onnxruntime's scores of the same ONNX model and
the repository's own label file; wrong K or outputs refused before anything is sent. Triton itself
refuses a classified output in a shared-memory region: the shared-memory transport receives that
output in the answer and keeps the others in its regions."""

from __future__ import annotations

import os

import numpy as np
import pytest

from coffea_sonic import TritonModel, zoo
from coffea_sonic.classification import parse_classes
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.repository import config_text, parse_config, write_repository
from coffea_sonic.transport.shm import SystemShmTransport
from experiment_repository import LABELS, experiment_repository, particle_inputs
from helpers import assert_sent_over

torch = pytest.importorskip("torch")  # the repository's models are exported by torch
onnxruntime = pytest.importorskip("onnxruntime")

ROWS = 450  # above pnet_onnx's max_batch_size of 200: several requests per call


MET_LABELS = ["met_px", "met_py"]


def add_labelled_deepmet(repository) -> None:
    """The zoo's deepmet beside the experiment's models, its ``met`` output labelled (two
    classes) and ``weights`` not: one classified and one plain output in a call."""
    write_repository(repository, ["deepmet"])
    config = parse_config(repository / "deepmet" / "config.pbtxt")
    next(o for o in config.output if o.name == "met").label_filename = "labels.txt"
    (repository / "deepmet" / "config.pbtxt").write_text(config_text(config))
    (repository / "deepmet" / "labels.txt").write_text("\n".join(MET_LABELS) + "\n")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = experiment_repository(tmp_path_factory.mktemp("classified") / "models")
    add_labelled_deepmet(repository)
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
            # the only output is classified: its answer comes back in the message, even over shm
            answer = assert_sent_over(transport, server.grpc_address, lambda: model(feed),
                                      outputs_in_shm=False)
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


def test_triton_refuses_a_classified_output_in_shared_memory(served):
    """What the shared-memory transport works around: the server's own rule, on the real server
    (tritonclient refuses the same request before sending it)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as shared_memory
    from tritonclient.utils import InferenceServerException

    server, feed, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_address)
    name = f"classified_{os.getpid()}"
    region = shared_memory.create_shared_memory_region(name, "/" + name, 1 << 16)
    try:
        client.register_system_shared_memory(name, "/" + name, 1 << 16)
        inputs = []
        for key, value in feed.items():
            tensor = grpcclient.InferInput(key, list(value.shape), "FP32")
            inputs.append(tensor.set_data_from_numpy(value))
        output = grpcclient.InferRequestedOutput("softmax", class_count=2)
        with pytest.raises(InferenceServerException, match="classification output"):
            output.set_shared_memory(name, 1 << 16)
        output._output.parameters["shared_memory_region"].string_param = name
        output._output.parameters["shared_memory_byte_size"].int64_param = 1 << 16
        with pytest.raises(InferenceServerException,
                           match="can't set both 'shared_memory_region' and 'classification'"):
            client.infer("pnet_onnx", inputs, outputs=[output])
    finally:
        client.unregister_system_shared_memory(name)
        shared_memory.destroy_shared_memory_region(region)
        client.close()


def test_over_shared_memory_a_classified_output_comes_in_the_answer_and_the_others_in_regions(
        served, monkeypatch):
    server, _, _ = served
    sent = []
    original = SystemShmTransport._message

    def recorded(self, request, slot, layout):
        message = original(self, request, slot, layout)
        sent.append(message)
        return message

    monkeypatch.setattr(SystemShmTransport, "_message", recorded)
    inputs = zoo.example_inputs("deepmet", 300, seed=3)
    model = TritonModel(server.url("deepmet"), transport="shm", classification={"met": 2},
                        fallback="off")
    plain = TritonModel(server.url("deepmet"), transport="grpc", fallback="off")
    try:
        answer = assert_sent_over("shm", server.grpc_address, lambda: model(inputs))
        expected = plain(inputs)
    finally:
        model.close()
        plain.close()
    assert sent and model.transport_kind == "shm"
    for message in sent:
        parameters = {output.name: output.parameters for output in message.outputs}
        assert "shared_memory_region" in parameters["weights"]
        assert "shared_memory_region" not in parameters["met"]
        assert parameters["met"]["classification"].int64_param == 2
    np.testing.assert_allclose(answer["weights"], expected["weights"], atol=1e-6)
    values, indices, labels = parse_classes(answer["met"])
    best = np.argsort(-expected["met"], axis=1, kind="stable")
    np.testing.assert_array_equal(indices, best)
    np.testing.assert_allclose(values, np.take_along_axis(expected["met"], best, axis=1),
                               rtol=1e-5, atol=1e-4)
    assert labels.tolist() == [[MET_LABELS[i] for i in row] for row in best]


@pytest.mark.parametrize("model_name, choice, complaint", [
    ("pnet_onnx", 4,
     r"'pnet_onnx' output 'softmax'.*classification=4.*\(softmax FP32\[3\]: 3\); use at most 3"),
    ("pnet_onnx", {"scores": 2}, r"'pnet_onnx'.*outputs \['scores'\].*its outputs: \['softmax'\]"),
    ("deepmet", {"weights": 1},
     r"'deepmet' output 'weights'.*expected an output with label_filename, actual: no label"),
    ("deepmet", 1, r"'deepmet' output 'weights'.*label_filename"),
])
def test_a_classification_the_model_cannot_give_is_refused_before_sending(served, model_name,
                                                                          choice, complaint):
    server, feed, _ = served
    inputs = feed if model_name == "pnet_onnx" else zoo.example_inputs("deepmet", 10)
    model = TritonModel(server.url(model_name), classification=choice, fallback="off")
    try:
        with pytest.raises(ConfigurationError, match=complaint):
            model(inputs)
        assert model.stats.requests == 0
    finally:
        model.close()


@pytest.mark.parametrize("options, complaint", [
    ({"classification": 0}, r"model 'pnet_onnx'.*whole number >= 1.*got 0"),
    ({"classification": -1}, r"model 'pnet_onnx'.*whole number >= 1.*got -1"),
    ({"classification": {"softmax": 1.5}}, r"model 'pnet_onnx' output 'softmax'.*got 1.5"),
    ({"classification": {"softmax": 0}}, r"output 'softmax'.*got 0"),
    ({"classification": {}}, "names no output"),
    ({"classification": 2, "fallback": "cpu"}, "fallback='off' and shadow=0"),
])
def test_classification_options_are_checked_when_the_model_is_made(options, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        TritonModel("triton+grpc://127.0.0.1:1/pnet_onnx", **options)
