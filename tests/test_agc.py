"""The Analysis Grand Challenge's ML step as an example analysis (examples/agc.py): the zoo's BDT
pair served by a real tritonserver (FIL backend), a real coffea Runner on a real Dask
LocalCluster, on the synthetic AGC-like sample and on coffea's real NanoAOD files; histograms
equal to the same processor with in-process XGBoost."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import awkward as ak
import numpy as np
import pytest
import xgboost
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import LocalTritonServer, TritonModel
from coffea_sonic.data.agc_sample import write_agc_sample
from real_samples import fetch_coffea_test_samples
from coffea_sonic.examples.agc import MODEL_NAME, AgcProcessor, agc_features, select
from coffea_sonic.examples.agc_features import FEATURE_NAMES, features_from_arrays, permutations
from zoo_training.train_agc_bdt import truth_labelled_permutations
from coffea_sonic.zoo.trees import tree_file

QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
REAL_NANOAOD_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "real-nanoaod"
ZOO = Path(tree_file(MODEL_NAME, 1)).parent
LOCAL = {1: str(ZOO / "agc_bdt_odd.json"), 2: str(ZOO / "agc_bdt_even.json")}


@pytest.fixture(scope="module")
def server():
    with LocalTritonServer(models=[MODEL_NAME], device="cpu") as running:
        yield running


@pytest.fixture(scope="module")
def url(server):
    return f"triton+grpc://{server.grpc_address}"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_agc_sample(tmp_path_factory.mktemp("agc"), events=1500, files=2, seed=4)


def _executor(kind, **options):
    """An executor that runs each chunk once (coffea reruns failing chunks by default)."""
    if "retries" in {field.name for field in dataclasses.fields(kind)}:
        options["retries"] = 0
    return kind(**options)


def _run(executor, fileset, instance, chunksize=1000):
    runner = processor.Runner(executor=executor, schema=QuietSchema, chunksize=chunksize)
    return runner({name: {"files": {path: "Events" for path in files}}
                   for name, files in fileset.items()},
                  treename="Events", processor_instance=instance)


def _assert_same_histograms(first, second):
    for group in ("hist_dict", "ml_hist_dict"):
        assert sorted(first[group]) == sorted(second[group])
        for name, histogram in first[group].items():
            other = second[group][name]
            assert list(histogram.axes["variation"]) == list(other.axes["variation"]), name
            # equal up to the order coffea adds the chunks' weighted sums in
            np.testing.assert_allclose(histogram.values(), other.values(), rtol=1e-12, atol=0,
                                       err_msg=name)
            np.testing.assert_allclose(histogram.variances(), other.variances(), rtol=1e-12,
                                       atol=0, err_msg=name)
            if "nominal" in list(histogram.axes["variation"]):  # unweighted: exactly equal
                np.testing.assert_array_equal(histogram[:, :, "nominal"].values(),
                                              other[:, :, "nominal"].values(), err_msg=name)


@pytest.fixture(scope="module")
def local_output(sample):
    return _run(_executor(processor.IterativeExecutor), sample, AgcProcessor(local_models=LOCAL))


def test_each_served_version_answers_like_its_own_zoo_file(server):
    rows, _, _, _ = truth_labelled_permutations(300, seed=11)
    for version, filename in ((1, "agc_bdt_odd.json"), (2, "agc_bdt_even.json")):
        model = TritonModel(f"triton+grpc://{server.grpc_address}/{MODEL_NAME}/{version}",
                            retry={"max_attempts": 1})
        answer = model({"input__0": rows})["output__0"]
        expected = xgboost.Booster(model_file=str(ZOO / filename)).inplace_predict(rows)
        np.testing.assert_allclose(answer[:, 1], expected, rtol=0, atol=1e-6)
    assert (ZOO / "agc_bdt_odd.json").stat().st_size < 300_000
    assert (ZOO / "agc_bdt_even.json").stat().st_size < 300_000


def test_the_zoo_bdt_finds_the_true_permutation_far_more_often_than_chance():
    rows, labels, counts, numbers = truth_labelled_permutations(4000, seed=99,
                                                                first_event=10 ** 7)
    even = np.repeat(numbers % 2 == 0, counts)
    scores = np.zeros(len(rows))
    scores[even] = xgboost.Booster(model_file=LOCAL[1]).inplace_predict(rows[even])
    scores[~even] = xgboost.Booster(model_file=LOCAL[2]).inplace_predict(rows[~even])
    best = ak.to_numpy(ak.argmax(ak.unflatten(scores, counts), axis=1))
    right = labels[np.cumsum(counts) - counts + best].mean()
    chance = np.mean(1.0 / counts)
    assert len(counts) > 200
    assert right > 0.5 > 5 * chance, (right, chance)


def test_permutations_are_the_agc_s_order_and_counts():
    # get_permutations_dict: ordered 4-tuples of distinct jets, lexicographic, and of the two
    # orders of each W pair the later one
    for n, count in ((4, 12), (5, 60), (6, 180)):
        table = permutations(n).tolist()
        assert len(table) == count
        seen, expected = set(), []
        for combo in itertools.permutations(range(n), 4):
            key = (frozenset(combo[:2]), combo[2], combo[3])
            if key in seen:
                expected.append(list(combo))
            seen.add(key)
        assert table == expected


def _straightforward_features(jets, lepton, perm):
    """One permutation's 20 features, written out the way a physicist would by hand."""
    def four_vector(pt, eta, phi, mass):
        px, py, pz = pt * math.cos(phi), pt * math.sin(phi), pt * math.sinh(eta)
        return np.array([px, py, pz, math.sqrt(px * px + py * py + pz * pz + mass * mass)])

    def mass(p):
        return math.sqrt(max(p[3] ** 2 - p[0] ** 2 - p[1] ** 2 - p[2] ** 2, 0.0))

    w1, w2, bh, bl = (jets[i] for i in perm)
    v = {k: four_vector(j["pt"], j["eta"], j["phi"], j["mass"])
         for k, j in (("w1", w1), ("w2", w2), ("bh", bh), ("bl", bl))}
    lep = four_vector(lepton["pt"], lepton["eta"], lepton["phi"], lepton["mass"])
    top = v["w1"] + v["w2"] + v["bh"]

    def dr(a, b):
        return math.hypot(a["eta"] - b["eta"], a["phi"] - b["phi"])

    return ([dr(lepton, bl), dr(w1, w2), dr(w1, bh), dr(w2, bh), mass(lep + v["bl"]),
             mass(v["w1"] + v["w2"]), mass(top), math.hypot(top[0], top[1])]
            + [j["pt"] for j in (w1, w2, bh, bl)] + [j["btagCSVV2"] for j in (w1, w2, bh, bl)]
            + [j["qgl"] for j in (w1, w2, bh, bl)])


def test_features_equal_a_straightforward_computation_on_a_few_events():
    rng = np.random.default_rng(8)
    n_jets = np.array([4, 5, 6, 8])
    fields = ("pt", "eta", "phi", "mass", "btagCSVV2", "qgl")
    events = [[{f: float(v) for f, v in zip(fields, (rng.uniform(30, 200), rng.normal(0, 1.5),
                                                       rng.uniform(-3.1, 3.1),
                                                       rng.uniform(2, 20), rng.random(),
                                                       rng.random()))}
               for _ in range(n)] for n in n_jets]
    leptons = [{"pt": float(rng.uniform(30, 100)), "eta": float(rng.normal()),
                "phi": float(rng.uniform(-3, 3)), "mass": 0.105} for _ in n_jets]
    arrays = {f: np.array([[j[f] for j in e[:6]] + [0.0] * (6 - min(len(e), 6))
                           for e in events]) for f in fields}
    lepton = {f: np.array([lep[f] for lep in leptons]) for f in ("pt", "eta", "phi", "mass")}
    rows, counts = features_from_arrays(arrays, lepton, n_jets)
    assert counts.tolist() == [12, 60, 180, 180] and rows.shape == (432, len(FEATURE_NAMES))
    start = 0
    for jets, lep, count in zip(events, leptons, counts):
        n = min(len(jets), 6)
        for offset, perm in enumerate(permutations(n)):
            expected = _straightforward_features(jets, lep, perm)
            np.testing.assert_allclose(rows[start + offset], expected, rtol=2e-6, atol=1e-5)
        start += count


def test_served_histograms_under_dask_equal_local_xgboost(sample, url, dask_two_workers,
                                                          local_output):
    served = _run(_executor(processor.DaskExecutor, client=dask_two_workers), sample,
                  AgcProcessor(url))
    _assert_same_histograms(served, local_output)
    assert served["nevents"] == {"ttbar": 3000}
    selected = served["selected"]["ttbar"]["4j2b"]
    assert served["selected"]["ttbar"]["4j1b"] > 0
    assert selected > 300
    top_mass = served["ml_hist_dict"]["mass_w1w2btophad"][:, "ttbar", "nominal"]
    assert top_mass.values(flow=True).sum() == selected
    peak = top_mass.axes[0].centers[np.argmax(top_mass.values())]
    assert 140 < peak < 200, peak  # the best permutation reconstructs the top


def test_weight_only_variations_repeat_the_nominal_call_and_are_sent_once(sample, url,
                                                                          local_output):
    served = _run(_executor(processor.IterativeExecutor), sample, AgcProcessor(url))
    _assert_same_histograms(served, local_output)
    variations = list(served["ml_hist_dict"]["pt_w1"].axes["variation"])
    assert variations == ["nominal", "pt_scale_up", "pt_res_up"] + [
        f"btag_var_{i}_{d}" for i in range(4) for d in ("up", "down")]
    stats = served["inference"]
    chunks = 4  # 2 files x 1500 events, chunks of 1000
    for name in ("bdt_v1", "bdt_v2"):
        # per chunk: nominal and the two jet variations sent, the four btag variations repeat
        assert stats[name].repeat_calls == 4 * chunks, (name, stats[name])
        assert stats[name].repeat_rows > 0


def test_the_processor_runs_on_real_cms_nanoaod_where_few_events_pass(url):
    paths = fetch_coffea_test_samples(REAL_NANOAOD_CACHE)
    fileset = {name: [str(paths[name])] for name in ("nano_dy", "nano_dimuon")}
    served = _run(_executor(processor.IterativeExecutor), fileset, AgcProcessor(url))
    local = _run(_executor(processor.IterativeExecutor), fileset,
                 AgcProcessor(local_models=LOCAL))
    assert served["nevents"] == {"nano_dy": 40, "nano_dimuon": 40}
    # of 40 Drell-Yan events 8 have one selected lepton and none four selected jets; of 40
    # dimuon data events 6 have four jets and none one lepton: no event reaches a region
    assert served["selected"] == {"nano_dy": {"4j1b": 0, "4j2b": 0},
                                  "nano_dimuon": {"4j1b": 0, "4j2b": 0}}
    _assert_same_histograms(served, local)


def test_even_events_are_scored_by_version_1_and_odd_ones_by_version_2(url):
    """The train/test-clean rule: each event by the model not trained on its parity."""
    rows, _, counts, numbers = truth_labelled_permutations(200, seed=12)
    even = np.repeat(numbers % 2 == 0, counts)
    assert even.any() and (~even).any()
    served = AgcProcessor(url).score(rows, even)
    trained_on_odd = xgboost.Booster(model_file=LOCAL[1]).inplace_predict(rows)
    trained_on_even = xgboost.Booster(model_file=LOCAL[2]).inplace_predict(rows)
    np.testing.assert_allclose(served[even], trained_on_odd[even], rtol=0, atol=1e-6)
    np.testing.assert_allclose(served[~even], trained_on_even[~even], rtol=0, atol=1e-6)
    assert np.abs(trained_on_odd - trained_on_even).max() > 0.05  # two different models


def test_real_cms_jets_make_features_the_server_scores_like_xgboost(url):
    """The selection leaves no real event, so the features and scores are checked on the real
    dimuon events with four selected jets, their leading muon standing in for the lepton."""
    from coffea.nanoevents import NanoEventsFactory

    paths = fetch_coffea_test_samples(REAL_NANOAOD_CACHE)
    events = NanoEventsFactory.from_root({str(paths["nano_dimuon"]): "Events"},
                                         schemaclass=QuietSchema, mode="eager").events()
    selected = select(events, events.Jet)
    keep = ak.to_numpy((ak.num(selected["jets"]) >= 4) & (ak.num(events.Muon) >= 1))
    assert keep.sum() >= 3
    rows, counts = agc_features(selected["jets"][keep], events.Electron[keep][:, :0],
                                events.Muon[keep][:, :1])
    assert set(counts.tolist()) <= {12, 60, 180} and len(rows) == counts.sum()
    assert np.isfinite(rows).all() and (rows[:, 8:12] > 30).all()
    even = np.repeat(ak.to_numpy(events.event[keep] % 2 == 0), counts)
    served = AgcProcessor(url).score(rows, even)
    local = AgcProcessor(local_models=LOCAL).score(rows, even)
    np.testing.assert_allclose(served, local, rtol=0, atol=1e-6)


def test_training_again_gives_the_committed_models(tmp_path):
    from zoo_training.train_agc_bdt import main

    main(tmp_path)
    rows, _, _, _ = truth_labelled_permutations(300, seed=13)
    for filename in ("agc_bdt_odd.json", "agc_bdt_even.json"):
        again = xgboost.Booster(model_file=str(tmp_path / filename)).inplace_predict(rows)
        committed = xgboost.Booster(model_file=str(ZOO / filename)).inplace_predict(rows)
        np.testing.assert_allclose(again, committed, rtol=0, atol=1e-6, err_msg=filename)
