"""The trained, shipped jet_tagger: separates b from light jets, torch and ONNX agree, training is
reproducible, and the real tritonserver serves exactly the shipped weights."""

from __future__ import annotations

import awkward as ak
import numpy as np
import onnxruntime
import pytest
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

from coffea_sonic import zoo
from coffea_sonic.columns import jagged_counts, jet_features, unflatten
from coffea_sonic.data import draw_labelled_jets, write_sample
from coffea_sonic.errors import InputValidationError
from coffea_sonic.zoo.spec import JET_CLASSES, JET_TAGGER_FEATURES
from zoo_training.train import b_vs_light_auc, roc_auc, train_jet_tagger

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore:Missing cross-reference")

#: Seeds never used for training the shipped model (it used seed 0 and its validation offset).
FRESH_SEED = 20_261_126


@pytest.fixture(scope="module")
def shipped_session():
    return onnxruntime.InferenceSession(str(zoo.onnx_path("jet_tagger")),
                                        providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def fresh_ttbar_events(tmp_path_factory):
    fileset = write_sample(tmp_path_factory.mktemp("tagger"), events=2000, files=1,
                           seed=FRESH_SEED, datasets=["ttbar"])
    return NanoEventsFactory.from_root({fileset["ttbar"][0]: "Events"},
                                       schemaclass=NanoAODSchema, mode="virtual").events()


def test_shipped_tagger_separates_b_from_light_jets_of_a_fresh_sample(shipped_session,
                                                                        fresh_ttbar_events):
    jets = fresh_ttbar_events.Jet
    rows = jet_features(jets)
    probs = shipped_session.run(["probs"], {"features": rows})[0]
    flavour = ak.to_numpy(ak.flatten(jets.hadronFlavour))
    tagger_auc = b_vs_light_auc(probs, flavour)
    btag_only = np.zeros_like(probs)
    btag_only[:, JET_CLASSES.index("b")] = rows[:, JET_TAGGER_FEATURES.index("btagDeepFlavB")]
    assert tagger_auc > 0.8
    # it learned more than the input b-tag discriminant alone
    assert tagger_auc > b_vs_light_auc(btag_only, flavour) + 0.02
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    per_jet = unflatten(probs, jagged_counts(jets))
    assert ak.all(ak.num(per_jet) == ak.num(jets))


def test_torch_module_loads_the_shipped_weights(shipped_session):
    features, _ = draw_labelled_jets(5000, seed=FRESH_SEED)
    expected = shipped_session.run(["probs"], {"features": features})[0]
    with torch.no_grad():
        got = zoo.torch_module("jet_tagger")(torch.from_numpy(features)).numpy()
    assert np.max(np.abs(got - expected)) < 1e-5


def test_training_is_reproducible_by_seed_and_learns():
    first = train_jet_tagger(n_jets=6144, seed=3, epochs=2, n_validation=2000)
    second = train_jet_tagger(n_jets=6144, seed=3, epochs=2, n_validation=2000)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name
    features, flavour = draw_labelled_jets(4000, seed=FRESH_SEED)
    with torch.no_grad():
        probs = first(torch.from_numpy(features)).numpy()
    assert b_vs_light_auc(probs, flavour) > 0.85
    with pytest.raises(InputValidationError, match="n_jets >= batch_size"):
        train_jet_tagger(n_jets=10)


def test_roc_auc_counts_ties_as_half_and_refuses_one_class():
    assert roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([False, False, True, True])) == 0.75
    assert roc_auc(np.array([0.5, 0.5, 0.5]), np.array([True, False, False])) == 0.5
    with pytest.raises(InputValidationError, match="both classes"):
        roc_auc(np.array([0.1, 0.2]), np.array([True, True]))


def test_served_jet_tagger_returns_the_shipped_models_outputs(jet_tagger_server, shipped_session,
                                                             fresh_ttbar_events):
    import tritonclient.grpc as grpcclient

    rows = jet_features(fresh_ttbar_events.Jet)[:4096]
    client = grpcclient.InferenceServerClient(jet_tagger_server.grpc_address)
    try:
        request = grpcclient.InferInput("features", list(rows.shape), "FP32")
        request.set_data_from_numpy(rows)
        served = client.infer("jet_tagger", [request]).as_numpy("probs")
    finally:
        client.close()
    expected = shipped_session.run(["probs"], {"features": rows})[0]
    assert served.shape == (len(rows), len(JET_CLASSES))
    assert np.max(np.abs(served - expected)) < 1e-5
