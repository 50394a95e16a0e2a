"""The synthetic NanoAOD-like sample: written with uproot, read back by real coffea NanoEvents."""

from __future__ import annotations

import argparse
import json

import awkward as ak
import numpy as np
import pytest
import uproot
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory, PFNanoAODSchema

from coffea_sonic.columns import jet_constituents
from coffea_sonic.data import DATASETS, dataset_tools_fileset, draw_labelled_jets, write_sample
from coffea_sonic.data import cli as sample_cli
from coffea_sonic.data import nanoaod
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES

pytestmark = pytest.mark.filterwarnings("ignore:Missing cross-reference")

EVENTS, FILES, SEED = 1500, 2, 11


def open_events(path, schema=NanoAODSchema):
    return NanoEventsFactory.from_root({str(path): "Events"}, schemaclass=schema,
                                       mode="virtual").events()


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_sample(tmp_path_factory.mktemp("sample"), events=EVENTS, files=FILES, seed=SEED)


def read_all_branches(paths):
    return [uproot.open(path)["Events"].arrays(library="ak") for path in paths]


def test_sample_has_both_datasets_split_over_files(sample):
    assert sorted(sample) == sorted(DATASETS)
    for paths in sample.values():
        assert len(paths) == FILES
        assert sum(uproot.open(p)["Events"].num_entries for p in paths) == EVENTS


def test_sample_files_read_with_nanoaod_schema(sample):
    for paths in sample.values():
        for path in paths:
            events = open_events(path)
            assert len(events) == EVENTS // FILES
            assert set(JET_TAGGER_FEATURES) <= set(events.Jet.fields)
            assert {"hadronFlavour", "partonFlavour", "area"} <= set(events.Jet.fields)
            assert {"PFCands", "JetPFCands", "run", "luminosityBlock", "event",
                    "genWeight"} <= set(events.fields)
            # vector behaviour works on the jets coffea builds from our branches
            jets = events.Jet
            assert ak.all(abs(np.hypot(jets.px, jets.py) / jets.pt - 1) < 1e-5, axis=None)


def test_branch_types_match_the_nanoaod_declaration(sample):
    tree = uproot.open(sample["ttbar"][0])["Events"]
    for collection, fields in nanoaod.COLLECTIONS.items():
        assert nanoaod.counter(collection) in tree.keys()
        for field, dtype in fields.items():
            interpretation = tree[nanoaod.branch(collection, field)].interpretation
            assert interpretation.content.to_dtype == np.dtype(dtype), (collection, field)
    assert tree["Jet_nConstituents"].typename == "uint8_t[]"  # UChar_t as in real NanoAOD
    for name, dtype in nanoaod.EVENT_BRANCH_DTYPES.items():
        assert tree[name].interpretation.to_dtype == np.dtype(dtype)
    assert sorted(tree.keys()) == sorted(nanoaod.all_branches())


def test_sample_is_deterministic_by_seed(sample, tmp_path):
    again = write_sample(tmp_path / "again", events=EVENTS, files=FILES, seed=SEED)
    other = write_sample(tmp_path / "other", events=EVENTS, files=FILES, seed=SEED + 1,
                         datasets=["ttbar"])
    for dataset in DATASETS:
        for first, second in zip(read_all_branches(sample[dataset]),
                                 read_all_branches(again[dataset])):
            assert first.fields == second.fields
            assert all(ak.all(first[name] == second[name], axis=None) for name in first.fields)
    first_pt = read_all_branches(sample["ttbar"])[0]["Jet_pt"]
    other_pt = read_all_branches(other["ttbar"])[0]["Jet_pt"]
    assert ak.to_list(first_pt) != ak.to_list(other_pt)


def test_event_numbers_are_unique_across_files(sample):
    for paths in sample.values():
        numbers = np.concatenate([uproot.open(p)["Events"]["event"].array(library="np")
                                  for p in paths])
        assert len(np.unique(numbers)) == EVENTS


def test_ttbar_has_b_jets_and_qcd_light_has_none(sample):
    ttbar = ak.flatten(open_events(sample["ttbar"][0]).Jet.hadronFlavour)
    qcd = ak.flatten(open_events(sample["qcd_light"][0]).Jet.hadronFlavour)
    assert set(np.unique(ak.to_numpy(ttbar)).tolist()) == {0, 4, 5}
    assert set(np.unique(ak.to_numpy(qcd)).tolist()) == {0, 4}


def test_events_with_no_jets_and_with_many_jets_exist(sample):
    multiplicity = np.concatenate(
        [ak.to_numpy(ak.num(open_events(p).Jet)) for p in sample["qcd_light"]])
    assert np.count_nonzero(multiplicity == 0) > 10
    assert multiplicity.max() >= 10


def test_b_jets_score_higher_btag_and_have_more_constituents(sample):
    jets = ak.flatten(open_events(sample["ttbar"][0]).Jet)
    is_b, is_light = jets.hadronFlavour == 5, jets.hadronFlavour == 0
    assert ak.mean(jets.btagDeepFlavB[is_b]) > ak.mean(jets.btagDeepFlavB[is_light]) + 0.3
    assert ak.mean(jets.nConstituents[is_b]) > ak.mean(jets.nConstituents[is_light]) + 3
    # ... but not trivially: some b jets score low and some light jets high
    assert ak.mean(jets.btagDeepFlavB[is_b] < 0.3) > 0.1
    assert ak.mean(jets.btagDeepFlavB[is_light] > 0.3) > 0.02


def test_jets_are_sorted_by_descending_pt(sample):
    pt = open_events(sample["ttbar"][0]).Jet.pt
    assert ak.all(ak.all(pt[:, 1:] <= pt[:, :-1], axis=1))


def test_pfnano_links_match_constituent_counts(sample):
    events = open_events(sample["ttbar"][0], schema=PFNanoAODSchema)
    n_constituents = events.Jet.nConstituents
    assert ak.all(ak.sum(n_constituents, axis=1) == ak.num(events.JetPFCands))
    assert ak.max(n_constituents) > 32 >= ak.min(n_constituents)
    ours = jet_constituents(events)
    coffeas = events.Jet.constituents.pf  # coffea's own PFNano cross-reference
    assert ak.all(ak.num(ours, axis=2) == n_constituents)
    for field in ("pt", "eta", "phi", "charge"):
        assert ak.all(ak.flatten(ours[field], axis=None) == ak.flatten(coffeas[field], axis=None))
    # candidates sum up to their jet, within the generator's clipping of the jet cone
    assert ak.all(abs(ak.sum(ours.pt, axis=2) / events.Jet.pt - 1) < 1e-4, axis=None)
    assert ak.all(ak.num(events.PFCands) > ak.num(events.JetPFCands))  # unclustered candidates


def test_fewer_events_than_files_writes_readable_empty_files(tmp_path):
    fileset = write_sample(tmp_path, events=1, files=2, datasets=["qcd_light"])
    entries = [uproot.open(p)["Events"].num_entries for p in fileset["qcd_light"]]
    assert entries == [1, 0]
    assert len(open_events(fileset["qcd_light"][1]).Jet.pt) == 0


def test_unknown_dataset_and_bad_counts_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="unknown datasets.*zjets"):
        write_sample(tmp_path, events=10, datasets=["zjets"])
    with pytest.raises(ConfigurationError, match="files >= 1"):
        write_sample(tmp_path, events=10, files=0)


def test_labelled_jets_follow_fractions_and_seed():
    features, flavour = draw_labelled_jets(20_000, seed=4, fractions={5: 0.5, 0: 0.5})
    assert features.shape == (20_000, len(JET_TAGGER_FEATURES))
    assert features.dtype == np.float32 and flavour.dtype == np.int32
    assert set(np.unique(flavour).tolist()) == {0, 5}
    assert abs(np.mean(flavour == 5) - 0.5) < 0.02
    again, _ = draw_labelled_jets(20_000, seed=4, fractions={5: 0.5, 0: 0.5})
    assert np.array_equal(features, again)
    assert not np.array_equal(features, draw_labelled_jets(20_000, seed=5,
                                                          fractions={5: 0.5, 0: 0.5})[0])
    with pytest.raises(ConfigurationError, match="hadron flavours"):
        draw_labelled_jets(10, fractions={3: 1.0})


def test_sample_cli_writes_files_and_fileset(tmp_path):
    parser = argparse.ArgumentParser(prog="coffea-sonic")
    sample_cli.add_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sample", "--events", "40", "--n-files", "1", "--seed", "3",
                              "--datasets", "ttbar", "-o", str(tmp_path)])
    with pytest.raises(SystemExit):
        parser.parse_args(["sample", "--datasets", "ttbar,zjets", "-o", str(tmp_path)])
    assert args.func(args) == 0
    fileset = json.loads((tmp_path / "fileset.json").read_text())
    assert list(fileset) == ["ttbar"]
    assert uproot.open(fileset["ttbar"][0])["Events"].num_entries == 40
    assert dataset_tools_fileset(fileset) == {"ttbar": {"files": {fileset["ttbar"][0]: "Events"}}}
