"""SonicMixin and the example analysis on the real path: real server, real coffea, real Dask."""

from __future__ import annotations

import dataclasses
import pickle
import warnings
from pathlib import Path

import awkward as ak
import dask
import hist
import numpy as np
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

from coffea_sonic import SonicMixin, TritonModel, zoo
from real_samples import fetch_coffea_test_samples
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.stats import settled
from helpers import assert_sent_over, pickled_class_names, reference_engine

# client-level suite: every test runs over gRPC and over shared memory
pytestmark = pytest.mark.usefixtures("each_transport")

QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
REAL_NANOAOD_CACHE = Path(__file__).resolve().parents[1] / ".cache" / "real-nanoaod"


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_sample(tmp_path_factory.mktemp("sample"), events=1500, files=2, seed=3)


@pytest.fixture(scope="module")
def server_url(triton_server):
    return f"triton+grpc://{triton_server.grpc_address}"


def _runner_fileset(fileset):
    return {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()}


def _executor(kind, **options):
    """A coffea executor that runs each chunk once: coffea reruns a failing chunk by default
    (``retries=3``), which would hide a failure that goes away when rerun. Every executor has the
    field in coffea 2026; in 2025.7 only DaskExecutor does (the others run each chunk once)."""
    if "retries" in {field.name for field in dataclasses.fields(kind)}:
        options["retries"] = 0
    return kind(**options)


def _run(executor, fileset, url, schema=QuietSchema, chunksize=700):
    runner = processor.Runner(executor=executor, schema=schema, chunksize=chunksize)
    assert runner.retries == 0  # Runner's automatic retries follow the executor's
    return runner(_runner_fileset(fileset), treename="Events",
                  processor_instance=JetTaggingProcessor(url))


def _histogram_values(output, dataset):
    return {name: np.asarray(h[{"dataset": dataset}].values()) for name, h in output["histograms"].items()}


def _jet_tagger_requests(url):
    return TritonModel(f"{url}/jet_tagger").server_statistics().inference_count


@pytest.fixture(scope="module")
def iterative_output(sample, server_url, each_transport):
    return _run(_executor(processor.IterativeExecutor), sample, server_url)


@pytest.fixture(scope="module")
def dask_client(each_transport):
    """Two Dask worker processes, started with this module's transport setting."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


def test_outputs_are_identical_under_iterative_futures_and_dask_executors(sample, server_url,
                                                                           iterative_output,
                                                                           dask_client):
    futures_output = _run(_executor(processor.FuturesExecutor, workers=2), sample, server_url)
    dask_output = _run(_executor(processor.DaskExecutor, client=dask_client), sample, server_url)
    for other in (futures_output, dask_output):
        assert other["cutflow"] == iterative_output["cutflow"]
        for dataset in sample:
            expected = _histogram_values(iterative_output, dataset)
            for name, values in _histogram_values(other, dataset).items():
                np.testing.assert_array_equal(values, expected[name], err_msg=name)
        assert other["inference"]["jet_tagger"].rows == iterative_output["inference"]["jet_tagger"].rows
    total_jets = sum(entry["jets"] for entry in iterative_output["cutflow"].values())
    assert iterative_output["inference"]["jet_tagger"].rows == total_jets
    assert iterative_output["inference"]["particlenet_lite"].rows > 0


def test_dask_awkward_path_builds_without_inference_and_computes_the_same(sample, server_url,
                                                                           iterative_output):
    from coffea.dataset_tools import apply_to_fileset

    before = settled(lambda: _jet_tagger_requests(server_url))  # earlier tests' calls counted
    runnable = {name: {"files": {path: "Events" for path in files}} for name, files in sample.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        graphs = apply_to_fileset(JetTaggingProcessor(server_url), runnable, schemaclass=QuietSchema)
    assert _jet_tagger_requests(server_url) == before, "building the graph sent an inference"
    (computed,) = dask.compute(graphs, scheduler="sync")
    assert _jet_tagger_requests(server_url) > before
    for dataset in sample:
        expected = _histogram_values(iterative_output, dataset)
        for name, values in _histogram_values(computed[dataset], dataset).items():
            np.testing.assert_array_equal(values, expected[name], err_msg=name)
        assert int(computed[dataset]["cutflow"][dataset]["jets"]) == \
            iterative_output["cutflow"][dataset]["jets"]


class _ScorePerJet(SonicMixin, processor.ProcessorABC):
    def __init__(self, url):
        self.sonic_configure({"jet_tagger": f"{url}/jet_tagger"})

    def process(self, jets):
        from coffea_sonic import columns

        return self.infer("jet_tagger", {"features": columns.jet_features(jets)}, like=jets)

    def postprocess(self, accumulator):
        return accumulator


def test_jagged_outputs_align_with_events_of_zero_one_and_many_jets(server_url):
    features = zoo.example_inputs("jet_tagger", 9, seed=1)["features"]
    fields = ("pt", "eta", "phi", "mass", "btagDeepFlavB", "nConstituents")
    flat = ak.zip({name: features[:, index] for index, name in enumerate(fields)})
    counts = np.array([0, 1, 0, 5, 3, 0])
    jets = ak.unflatten(flat, counts)
    scores = _ScorePerJet(server_url).process(jets)["probs"]
    assert ak.num(scores).tolist() == ak.num(jets).tolist()
    expected = reference_engine("jet_tagger")({"features": features})["probs"]
    np.testing.assert_allclose(ak.to_numpy(ak.flatten(scores)), expected, atol=1e-5)
    empty = _ScorePerJet(server_url).process(jets[:0])["probs"]
    assert len(empty) == 0


def test_example_runs_unchanged_on_real_cms_nanoaod(server_url):
    real = fetch_coffea_test_samples(REAL_NANOAOD_CACHE)
    fileset = {"dy": [str(real["nano_dy"])], "data_dimuon": [str(real["nano_dimuon"])],
               "empty": [str(real["nano_dy_empty"])]}
    output = _run(_executor(processor.IterativeExecutor), fileset, server_url, schema=NanoAODSchema,
                  chunksize=25)
    assert output["cutflow"]["dy"]["events"] == 40
    assert output["cutflow"]["data_dimuon"]["events"] == 40
    dy_jets = output["cutflow"]["dy"]["jets"]
    assert dy_jets > 0
    b_score = output["histograms"]["b_score"]
    # simulation fills true flavours; collision data (no Jet_hadronFlavour) fills flavour -1
    assert b_score[{"dataset": "dy", "flavour": sum}].sum() == dy_jets
    data_jets = b_score[{"dataset": "data_dimuon", "flavour": hist.loc(-1)}].sum()
    assert data_jets == output["cutflow"]["data_dimuon"]["jets"] > 0
    assert output["histograms"]["particlenet_b"].sum() == 0  # no PF candidates in standard NanoAOD
    # per-jet scores equal the in-process model on the same file
    events = NanoEventsFactory.from_root({str(real["nano_dy"]): "Events"},
                                         schemaclass=NanoAODSchema, mode="eager").events()
    jets = events.Jet[events.Jet.pt > 15.0]
    served = _ScorePerJet(server_url).process(jets)["probs"]
    from coffea_sonic import columns

    local = reference_engine("jet_tagger")({"features": columns.jet_features(jets)})["probs"]
    np.testing.assert_allclose(ak.to_numpy(ak.flatten(served)), local, atol=1e-5)


def test_model_pickled_to_a_dask_worker_works_there_without_grpc_in_the_pickle(server_url,
                                                                              dask_client):
    model = TritonModel(f"{server_url}/jet_tagger")
    inputs = zoo.example_inputs("jet_tagger", 50)
    local = model(inputs)["probs"]  # the driver holds a live connection now
    payload = pickle.dumps(model)
    # configuration only: no channel, stub or transport object of this process travels
    assert not [name for name in pickled_class_names(payload)
                if name.split(" ")[0].startswith(("grpc", "tritonclient"))
                or "Transport" in name or "Connection" in name]
    remote = dask_client.submit(lambda m, x: m(x)["probs"], model, inputs).result()
    np.testing.assert_array_equal(remote, local)


def test_each_transport_case_sends_over_its_wire(triton_server, server_url, dask_client,
                                                 each_transport):
    # from the Dask workers, whose transports stay open between tasks
    model = TritonModel(f"{server_url}/jet_tagger")
    inputs = zoo.example_inputs("jet_tagger", 300)

    def on_every_worker():
        return dask_client.run(lambda: (model(inputs)["probs"], model.transport_kind))

    answers = assert_sent_over(each_transport, triton_server.grpc_address, on_every_worker)
    expected = reference_engine("jet_tagger")(inputs)["probs"]
    assert len(answers) == 2
    for probs, kind in answers.values():
        np.testing.assert_allclose(probs, expected, atol=1e-5)
        assert kind == each_transport
