"""awkward <-> numpy columns: eager arrays, real coffea NanoEvents, real dask-awkward partitions."""

from __future__ import annotations

import awkward as ak
import dask_awkward as dak
import numpy as np
import pytest
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory, PFNanoAODSchema

from coffea_sonic.columns import (flatten, is_typetracer, jagged_counts, jet_constituents,
                                  jet_features, unflatten)
from coffea_sonic.data import write_sample
from coffea_sonic.errors import InputValidationError
from coffea_sonic.zoo.inputs import pad_constituents
from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES, PARTICLENET_FEATURES

pytestmark = pytest.mark.filterwarnings("ignore:Missing cross-reference")

P = 32  # constituents per jet of particlenet_lite


@pytest.fixture(scope="module")
def ttbar_file(tmp_path_factory):
    fileset = write_sample(tmp_path_factory.mktemp("columns"), events=600, files=1, seed=5,
                           datasets=["ttbar"])
    return fileset["ttbar"][0]


def open_events(path, mode="virtual", schema=NanoAODSchema):
    return NanoEventsFactory.from_root({str(path): "Events"}, schemaclass=schema,
                                       mode=mode).events()


def jets_with_multiplicities(multiplicities, seed=0):
    rng = np.random.default_rng(seed)
    total = int(sum(multiplicities))
    flat = ak.zip({"pt": rng.uniform(20, 200, total).astype(np.float32),
                   "eta": rng.uniform(-2.5, 2.5, total).astype(np.float32),
                   "phi": rng.uniform(-3, 3, total).astype(np.float32),
                   "mass": rng.uniform(2, 20, total).astype(np.float32),
                   "btagDeepFlavB": rng.uniform(0, 1, total).astype(np.float32),
                   "nConstituents": rng.integers(2, 40, total).astype(np.uint8)})
    return ak.unflatten(flat, np.asarray(multiplicities, dtype=np.int64))


# --- flatten / unflatten -------------------------------------------------------------------


@pytest.mark.parametrize("multiplicities", [[0, 1, 5], [0, 0, 0], [1], [7, 0, 12, 3], []])
def test_flatten_unflatten_round_trip_with_zero_one_and_many_jets(multiplicities):
    jets = jets_with_multiplicities(multiplicities)
    rows, counts = flatten(jets.pt)
    assert rows.dtype == np.float32 and rows.shape == (sum(multiplicities),)
    assert counts.tolist() == list(multiplicities)
    back = unflatten(rows, counts)
    assert ak.all(ak.num(back) == ak.num(jets.pt))
    assert back.tolist() == jets.pt.tolist()


def test_unflatten_keeps_trailing_dims_and_aligns_with_input():
    jets = jets_with_multiplicities([2, 0, 3, 1])
    _, counts = flatten(jets.pt)
    probs = np.arange(6 * 3, dtype=np.float32).reshape(6, 3)
    out = unflatten(probs, counts)
    assert str(out.type) == "4 * var * 3 * float32"
    assert ak.all(ak.num(out) == ak.num(jets))
    assert out[2, 1].tolist() == probs[3].tolist()
    both = unflatten({"probs": probs, "score": probs[:, 0]}, counts)
    assert set(both) == {"probs", "score"} and both["score"].tolist()[2] == [6.0, 9.0, 12.0]


def test_flatten_keeps_fixed_size_inner_dims_of_a_column():
    column = ak.unflatten(ak.from_numpy(np.ones((5, 2, 3), np.float32), regulararray=True),
                          [2, 3])
    rows, counts = flatten(column)
    assert rows.shape == (5, 2, 3) and counts.tolist() == [2, 3]


def test_doubly_jagged_columns_round_trip():
    column = ak.Array([[[1.0, 2.0], []], [], [[3.0]]])
    rows, counts = flatten(column)
    assert rows.tolist() == [1.0, 2.0, 3.0]
    assert [level.tolist() for level in counts] == [[2, 0, 1], [2, 0, 1]]
    assert unflatten(rows, counts).tolist() == column.tolist()


def test_unflatten_refuses_rows_that_do_not_match_the_counts():
    with pytest.raises(InputValidationError, match="'probs' has 4 rows but the counts describe 3"):
        unflatten({"probs": np.zeros((4, 3))}, np.array([2, 1]))


def test_missing_values_and_records_are_refused_with_a_fix():
    with pytest.raises(InputValidationError, match="ak.fill_none"):
        flatten(ak.Array([[1.0, None], [2.0]]))
    with pytest.raises(InputValidationError, match="use jet_features"):
        flatten(jets_with_multiplicities([1, 2]))
    with pytest.raises(InputValidationError, match="map_partitions"):
        flatten(dak.from_awkward(ak.Array([[1.0]]), npartitions=1))


def test_jagged_counts_reads_only_offsets_of_records():
    jets = jets_with_multiplicities([3, 0, 2])
    assert jagged_counts(jets).tolist() == [3, 0, 2]
    assert jagged_counts(ak.Array([1.0, 2.0])) == ()


# --- jet_features ----------------------------------------------------------------------------


def test_jet_features_follow_the_tagger_field_order():
    jets = jets_with_multiplicities([2, 0, 1])
    rows = jet_features(jets)
    assert rows.shape == (3, len(JET_TAGGER_FEATURES)) and rows.dtype == np.float32
    for index, field in enumerate(JET_TAGGER_FEATURES):
        assert np.array_equal(rows[:, index], ak.to_numpy(ak.flatten(jets[field])).astype(
            np.float32))


def test_missing_jet_field_raises_naming_the_branch_unless_defaulted():
    jets = jets_with_multiplicities([2, 1])
    with pytest.raises(InputValidationError, match="Jet_hadronFlavour.*defaults="):
        jet_features(jets, ["pt", "hadronFlavour"])
    rows = jet_features(jets, ["pt", "hadronFlavour"], defaults={"hadronFlavour": -1})
    assert rows[:, 1].tolist() == [-1.0, -1.0, -1.0]
    only_defaults = jet_features(jets, ["hadronFlavour"], defaults={"hadronFlavour": 0})
    assert only_defaults.shape == (3, 1)


@pytest.mark.parametrize("multiplicities", [[], [0, 0]])
def test_jet_features_of_no_jets_are_empty(multiplicities):
    rows = jet_features(jets_with_multiplicities(multiplicities))
    assert rows.shape == (0, len(JET_TAGGER_FEATURES)) and rows.dtype == np.float32


def test_jet_features_on_nanoevents_align_with_the_jets(ttbar_file):
    events = open_events(ttbar_file)
    rows = jet_features(events.Jet)
    counts = jagged_counts(events.Jet)
    assert rows.shape == (int(ak.sum(ak.num(events.Jet))), len(JET_TAGGER_FEATURES))
    assert np.array_equal(rows[:, 0], ak.to_numpy(ak.flatten(events.Jet.pt)))
    assert np.array_equal(rows[:, 5], ak.to_numpy(ak.flatten(events.Jet.nConstituents)))
    out = unflatten(rows[:, 4], counts)
    assert ak.all(ak.num(out) == ak.num(events.Jet))
    assert ak.all(out == events.Jet.btagDeepFlavB, axis=None)
    # selections (a jagged mask) flatten in the selected order too
    selected = events.Jet[events.Jet.pt > 50]
    assert np.array_equal(jet_features(selected)[:, 0], ak.to_numpy(ak.flatten(selected.pt)))


def test_columns_work_inside_dask_awkward_map_partitions(ttbar_file):
    lazy = open_events(ttbar_file, mode="dask")

    def fake_tagger(events):
        rows = jet_features(events.Jet)
        probs = np.stack([rows[:, 4], 1 - rows[:, 4], np.zeros(len(rows), np.float32)], axis=1)
        return unflatten(probs, jagged_counts(events.Jet))

    scores = dak.map_partitions(fake_tagger, lazy)
    assert str(scores.type).endswith("var * 3 * float32")
    needed = set().union(*dak.necessary_columns(scores).values())
    assert {f"Jet_{field}" for field in JET_TAGGER_FEATURES} <= needed
    assert not any(name.startswith(("PFCands", "JetPFCands")) for name in needed)
    computed = scores.compute()
    eager = open_events(ttbar_file)
    assert ak.all(ak.num(computed) == ak.num(eager.Jet))
    assert ak.all(computed[:, :, 0] == eager.Jet.btagDeepFlavB, axis=None)


def test_typetracer_inputs_give_zero_rows_and_typetracer_outputs():
    jets = jets_with_multiplicities([2, 1])
    tracer = ak.Array(jets.layout.to_typetracer(forget_length=True))
    assert is_typetracer(tracer) and not is_typetracer(jets)
    rows = jet_features(tracer)
    assert rows.shape == (0, len(JET_TAGGER_FEATURES))
    counts = jagged_counts(tracer)
    out = unflatten(np.zeros((0, 3), np.float32), counts)
    assert is_typetracer(out) and str(out.type).endswith("var * 3 * float32")


# --- constituents -------------------------------------------------------------------------------


def test_jet_constituents_match_coffeas_pfnano_cross_reference(ttbar_file):
    events = open_events(ttbar_file, schema=PFNanoAODSchema)
    ours = jet_constituents(events, ["pt", "eta", "phi", "mass", "charge", "pdgId"])
    theirs = events.Jet.constituents.pf
    assert ak.all(ak.num(ours, axis=1) == ak.num(events.Jet))
    for field in ("pt", "eta", "phi", "mass", "charge", "pdgId"):
        assert ak.all(ours[field] == theirs[field], axis=None)


def test_jet_constituents_handle_unordered_links_and_jets_without_links():
    events = ak.Array([
        {"Jet": [{"pt": 1.0}, {"pt": 2.0}, {"pt": 3.0}],
         "PFCands": [{"pt": 10.0}, {"pt": 11.0}, {"pt": 12.0}],
         "JetPFCands": [{"jetIdx": 2, "pFCandsIdx": 0}, {"jetIdx": 0, "pFCandsIdx": 2},
                        {"jetIdx": 2, "pFCandsIdx": 1}]},
        {"Jet": [], "PFCands": [{"pt": 5.0}], "JetPFCands": []},
    ])
    assert jet_constituents(events, ["pt"]).pt.tolist() == [[[12.0], [], [10.0, 11.0]], []]


def test_out_of_range_links_are_reported_with_event_and_branch():
    events = ak.Array([{"Jet": [{"pt": 1.0}], "PFCands": [{"pt": 10.0}],
                        "JetPFCands": [{"jetIdx": 0, "pFCandsIdx": 3}]}])
    with pytest.raises(InputValidationError, match="JetPFCands_pFCandsIdx = 3 .* nPFCands = 1"):
        jet_constituents(events, ["pt"])
    with pytest.raises(InputValidationError, match="no 'PFCands' collection"):
        jet_constituents(ak.Array([{"Jet": [{"pt": 1.0}]}]))


def test_pad_constituents_shapes_masks_and_truncation(ttbar_file):
    events = open_events(ttbar_file)
    constituents = jet_constituents(events)
    inputs = pad_constituents(constituents, events.Jet)
    n_jets = int(ak.sum(ak.num(events.Jet)))
    assert inputs["pf_points"].shape == (n_jets, 2, P)
    assert inputs["pf_features"].shape == (n_jets, len(PARTICLENET_FEATURES), P)
    assert inputs["pf_mask"].shape == (n_jets, 1, P)
    assert all(array.dtype == np.float32 for array in inputs.values())
    n_constituents = ak.to_numpy(ak.flatten(events.Jet.nConstituents)).astype(int)
    assert np.array_equal(inputs["pf_mask"].sum(axis=(1, 2)), np.minimum(n_constituents, P))
    assert (n_constituents > P).any()
    # masked-out slots are zero everywhere; kept ones are the highest-pt constituents, descending
    padding = inputs["pf_mask"] == 0
    assert not np.any(inputs["pf_features"] * padding) and not np.any(inputs["pf_points"] * padding)
    log_pt = inputs["pf_features"][:, PARTICLENET_FEATURES.index("log_pt"), :]
    longest = int(np.argmax(n_constituents))
    expected = np.sort(ak.to_numpy(ak.flatten(constituents.pt)[longest]))[::-1][:P]
    assert np.allclose(np.exp(log_pt[longest]), expected, rtol=1e-5)
    # points repeat the deta/dphi features
    assert np.array_equal(inputs["pf_points"][:, 0], inputs["pf_features"][:, 4])
    assert np.array_equal(inputs["pf_points"][:, 1], inputs["pf_features"][:, 5])


def test_pad_constituents_feature_values_for_a_hand_made_jet():
    constituents = ak.Array([[[
        {"pt": 10.0, "eta": -0.1, "phi": 3.1, "mass": 0.0, "charge": 0},
        {"pt": 30.0, "eta": 0.1, "phi": -3.1, "mass": 0.0, "charge": -1},
    ]]])
    jets = ak.Array([[{"pt": 40.0, "eta": 0.0, "phi": 3.14, "mass": 0.0}]])
    inputs = pad_constituents(constituents, jets, max_constituents=4)
    features = dict(zip(PARTICLENET_FEATURES, inputs["pf_features"][0]))
    assert np.allclose(features["log_pt"][:2], np.log([30.0, 10.0]))
    assert np.allclose(features["log_pt_rel"][:2], np.log([0.75, 0.25]))
    assert np.allclose(features["log_e"][:2], np.log([30 * np.cosh(0.1), 10 * np.cosh(0.1)]))
    assert np.allclose(features["log_e_rel"][:2], np.log([30 * np.cosh(0.1) / 40,
                                                          10 * np.cosh(0.1) / 40]))
    assert np.allclose(features["deta"][:2], [0.1, -0.1])
    # dphi wraps across +-pi instead of jumping by 2 pi
    assert np.allclose(features["dphi"][:2], [-3.1 + 2 * np.pi - 3.14, 3.1 - 3.14], atol=1e-6)
    assert features["charge"][:2].tolist() == [-1.0, 0.0]
    assert inputs["pf_mask"][0, 0].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_pad_constituents_without_jets_uses_the_constituent_sum_axis():
    constituents = ak.Array([[{"pt": 20.0, "eta": 0.5, "phi": 0.2, "mass": 0.0, "charge": 1},
                              {"pt": 20.0, "eta": 0.5, "phi": -0.2, "mass": 0.0, "charge": 1}]])
    inputs = pad_constituents(constituents)  # [jets][constituents], no event axis
    features = dict(zip(PARTICLENET_FEATURES, inputs["pf_features"][0]))
    # the summed four-vector points along phi 0, at eta asinh(sum pz / sum pt)
    axis_eta = np.arcsinh(np.sinh(0.5) / np.cos(0.2))
    assert np.allclose(features["deta"][:2], 0.5 - axis_eta, atol=1e-6)
    assert np.allclose(sorted(features["dphi"][:2]), [-0.2, 0.2], atol=1e-6)


def test_pad_constituents_fills_a_missing_field_only_from_an_explicit_default():
    constituents = ak.Array([[[{"pt": 5.0, "eta": 0.0, "phi": 0.0, "mass": 0.0}] * 3]])
    with pytest.raises(InputValidationError, match="PFCands_charge"):
        pad_constituents(constituents)
    inputs = pad_constituents(constituents, defaults={"charge": 0})
    assert inputs["pf_mask"].sum() == 3
    assert not inputs["pf_features"][:, PARTICLENET_FEATURES.index("charge")].any()


def test_pad_constituents_of_empty_inputs_and_jets_without_constituents():
    empty = pad_constituents(ak.Array([[[{"pt": 1.0, "eta": 0.0, "phi": 0.0, "mass": 0.0,
                                          "charge": 0}]]])[:0])
    assert empty["pf_features"].shape == (0, len(PARTICLENET_FEATURES), P)
    constituents = ak.Array([[[], [{"pt": 5.0, "eta": 0.0, "phi": 0.0, "mass": 0.0,
                                    "charge": 1}]], []])
    inputs = pad_constituents(constituents)
    assert inputs["pf_mask"].sum(axis=(1, 2)).tolist() == [0.0, 1.0]
    assert not np.any(inputs["pf_features"][0])


def test_pad_constituents_inside_dask_awkward_map_partitions(ttbar_file):
    lazy = open_events(ttbar_file, mode="dask")

    def count_kept(events):
        inputs = pad_constituents(jet_constituents(events), events.Jet)
        return unflatten(inputs["pf_mask"].sum(axis=(1, 2)), jagged_counts(events.Jet))

    kept = dak.map_partitions(count_kept, lazy)
    needed = set().union(*dak.necessary_columns(kept).values())
    assert {"JetPFCands_jetIdx", "JetPFCands_pFCandsIdx", "PFCands_pt", "PFCands_charge"} <= needed
    eager = open_events(ttbar_file)
    assert ak.all(kept.compute() == np.minimum(eager.Jet.nConstituents, P), axis=None)
