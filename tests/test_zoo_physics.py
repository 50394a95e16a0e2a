"""The trained physics models of the zoo: particlenet separates b from light jets, deepmet beats PF
MET against GenMET, training is reproducible, and the real tritonserver serves exactly the shipped
weights (served == in-process)."""

from __future__ import annotations

import awkward as ak
import hist
import numpy as np
import pytest
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

from coffea_sonic import TritonModel, zoo
from coffea_sonic.columns import jet_constituents
from coffea_sonic.zoo.inputs import pad_constituents
from coffea_sonic.data import write_sample
from coffea_sonic.engines import CpuEngine
from coffea_sonic.zoo import physics
from zoo_training import physics as training
from zoo_training.train import b_vs_light_auc

pytestmark = pytest.mark.filterwarnings("ignore:Missing cross-reference")

#: Seeds never used for training the shipped models (they used seed 0 and its validation offset).
FRESH_SEED = 20_261_126


@pytest.fixture(scope="module")
def fresh_events(tmp_path_factory):
    fileset = write_sample(tmp_path_factory.mktemp("physics"), events=1500, files=1,
                           seed=FRESH_SEED)
    return {dataset: NanoEventsFactory.from_root({paths[0]: "Events"}, schemaclass=NanoAODSchema,
                                                 mode="eager").events()
            for dataset, paths in fileset.items()}


@pytest.fixture(scope="module")
def server(triton_server):
    """The session's server (it serves jet_tagger, particlenet and deepmet among the zoo)."""
    return triton_server


def _particlenet_inputs(events):
    return pad_constituents(jet_constituents(events), events.Jet)


def test_models_are_in_the_zoo_and_shipped():
    assert {"particlenet", "deepmet"} <= set(zoo.names())
    for name in ("particlenet", "deepmet"):
        assert zoo.spec(name).shipped and zoo.onnx_path(name).stat().st_size < 200_000


def test_shipped_particlenet_separates_b_from_light_in_a_fresh_sample_file(fresh_events):
    events = fresh_events["ttbar"]
    probs = CpuEngine("particlenet")(_particlenet_inputs(events))["probs"]
    flavour = ak.to_numpy(ak.flatten(events.Jet.hadronFlavour))
    assert probs.shape == (len(flavour), 3)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert b_vs_light_auc(probs, flavour) > 0.9
    # the untrained particlenet_lite does not
    lite = CpuEngine("particlenet_lite")(_particlenet_inputs(events))["probs"]
    assert b_vs_light_auc(lite, flavour) < b_vs_light_auc(probs, flavour) - 0.1


def test_shipped_deepmet_resolution_is_better_than_pf_met_in_a_fresh_sample_file(fresh_events):
    for events in fresh_events.values():
        met = CpuEngine("deepmet")(physics.deepmet_inputs(events.PFCands))["met"]
        gen = physics.met_vector(events.GenMET.pt, events.GenMET.phi)
        pf = physics.met_vector(events.MET.pt, events.MET.phi)
        ours, theirs = training.met_resolution(met, gen), training.met_resolution(pf, gen)
        assert ours < 0.8 * theirs, (ours, theirs)


def test_particlenet_training_is_reproducible_and_learns():
    first, auc = training.train_particlenet(n_events=1000, epochs=3, n_validation=300)
    second, again = training.train_particlenet(n_events=1000, epochs=3, n_validation=300)
    for (key, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert np.array_equal(a.numpy(), b.numpy()), key
    assert auc == again and auc > 0.7


def test_deepmet_training_is_reproducible_and_beats_pf_met():
    first, ours, pf = training.train_deepmet(n_events=2000, epochs=4, n_validation=500)
    second, again, _ = training.train_deepmet(n_events=2000, epochs=4, n_validation=500)
    for (key, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items()):
        assert np.array_equal(a.numpy(), b.numpy()), key
    assert ours == again and ours < pf


@pytest.mark.parametrize("name", ["particlenet", "deepmet"])
def test_served_equals_in_process(server, fresh_events, name):
    events = fresh_events["ttbar"]
    if name == "particlenet":
        inputs = _particlenet_inputs(events)
    else:
        inputs = physics.deepmet_inputs(events.PFCands)
    served = TritonModel(server.url(name))(inputs)
    local = CpuEngine(name)(inputs)
    assert sorted(served) == sorted(local) == sorted(zoo.spec(name).output_names)
    for key in local:
        assert served[key].shape == local[key].shape
        assert np.max(np.abs(served[key] - local[key])) <= 1e-5, (name, key)


def test_example_analysis_in_physics_mode_tags_every_jet_and_measures_met(server, tmp_path):
    from coffea import processor

    from coffea_sonic.examples.jet_tagging import JetTaggingProcessor, plot_scores

    fileset = write_sample(tmp_path, events=600, files=1, seed=FRESH_SEED)
    schema = type("Quiet", (NanoAODSchema,), {"warn_missing_crossrefs": False})
    analysis = JetTaggingProcessor(f"triton+grpc://{server.grpc_address}", physics=True)
    assert sorted(analysis.sonic_models) == ["deepmet", "jet_tagger", "particlenet"]
    output = processor.Runner(executor=processor.IterativeExecutor(), schema=schema)(
        {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()},
        treename="Events", processor_instance=analysis)
    histograms = output["histograms"]
    jets = sum(entry["jets"] for entry in output["cutflow"].values())
    assert output["inference"]["particlenet"].rows == jets > 0
    assert output["inference"]["deepmet"].rows == 1200
    scores = histograms["particlenet"][{"dataset": sum}]
    centres = scores.axes["score"].centers
    mean = {flavour: np.average(centres, weights=scores[{"flavour": hist.loc(flavour)}].values())
            for flavour in (5, 0)}
    assert mean[5] > mean[0] + 0.4
    residual = histograms["met_residual"][{"dataset": sum}]
    rms = {method: np.sqrt(np.average(residual.axes["residual"].centers ** 2,
                                      weights=residual[{"method": method}].values()))
           for method in ("deepmet", "PF MET")}
    assert rms["deepmet"] < 0.8 * rms["PF MET"]
    assert (tmp_path / "scores.png").exists() is False
    plot_scores(output, str(tmp_path / "scores.png"))
    assert (tmp_path / "scores.png").stat().st_size > 10_000
