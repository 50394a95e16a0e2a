"""A chunk's identical calls are sent once: a systematic loop whose weight-only variations feed
the model the nominal inputs again, run by coffea's Runner on real Dask against a real server, on
gRPC, shared memory and HTTP. The server's own statistics count the requests it got."""

from __future__ import annotations

import dataclasses
import logging

import awkward as ak
import hist
import numpy as np
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import LocalTritonServer, SonicMixin, TritonModel, columns
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.stats import settled
from helpers import assert_sent_over

QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
#: weight-only variations (the jets are the nominal ones) and a jet-energy-scale one
WEIGHT_VARIATIONS = {"weight_up": 1.1, "weight_down": 0.9, "pileup_up": 1.05}
SCALE = 1.03
CHUNKS = 4


class Variations(SonicMixin, processor.ProcessorABC):
    """The nominal call, three weight-only variations (identical inputs) and a pt-scaled one."""

    def __init__(self, url: str, transport: str, repeats: bool = True) -> None:
        self.sonic_configure({"jet_tagger": url}, transport=transport)
        self.sonic_repeats = repeats

    def _scores(self, jets):
        outputs = self.infer("jet_tagger", {"features": columns.jet_features(jets)}, like=jets)
        return ak.flatten(outputs["probs"][:, :, 0])

    def process(self, events):
        axis = hist.axis.StrCategory([], name="variation", growth=True)
        scores = hist.Hist(axis, hist.axis.Regular(20, 0, 1, name="score"), storage="weight")
        jets = events.Jet[events.Jet.pt > 30]
        nominal = self._scores(jets)
        scores.fill(variation="nominal", score=nominal)
        for name, weight in WEIGHT_VARIATIONS.items():
            scores.fill(variation=name, score=self._scores(jets), weight=weight)
        scaled = ak.with_field(jets, jets.pt * SCALE, "pt")
        scores.fill(variation="jes_up", score=self._scores(scaled))
        return {"scores": scores, "inference": self.sonic_stats()}

    def postprocess(self, accumulator):
        return accumulator


@pytest.fixture(scope="module")
def server():
    with LocalTritonServer(models=["jet_tagger"], device="cpu") as running:
        yield running


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return write_sample(tmp_path_factory.mktemp("sample"), events=800, files=1, seed=11)


def _url(server, transport: str) -> str:
    if transport == "http":
        return f"triton+http://{server.http_address}/jet_tagger"
    return f"triton+grpc://{server.grpc_address}/jet_tagger"


def _requests(server) -> int:
    return TritonModel(f"triton+grpc://{server.grpc_address}/jet_tagger",
                       transport="grpc").server_statistics().success_count


def _run(sample, url, transport, client, repeats: bool):
    executor = processor.DaskExecutor(client=client)
    if "retries" in {f.name for f in dataclasses.fields(processor.DaskExecutor)}:
        executor.retries = 0
    runner = processor.Runner(executor=executor, schema=QuietSchema,
                              chunksize=800 // CHUNKS)
    fileset = {name: {"files": {path: "Events" for path in files}} for name, files in sample.items()}
    return runner(fileset, treename="Events", processor_instance=Variations(url, transport, repeats))


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_weight_only_variations_send_no_request_and_fill_what_sending_them_fills(
        server, sample, dask_two_workers, transport, caplog):
    url, wire = _url(server, transport), "auto" if transport == "http" else transport
    chunks = CHUNKS * len(sample)
    before = settled(lambda: _requests(server))
    with caplog.at_level(logging.INFO, logger="coffea_sonic"):
        deduplicated = assert_sent_over(transport, server,
                                        lambda: _run(sample, url, wire, dask_two_workers, repeats=True))
    sent = settled(lambda: _requests(server)) - before
    every = _run(sample, url, wire, dask_two_workers, repeats=False)
    sent_without = settled(lambda: _requests(server)) - before - sent
    # 2 distinct inputs per chunk (nominal, jes_up) instead of 5
    assert (sent, sent_without) == (2 * chunks, 5 * chunks), (sent, sent_without)
    stats, stats_without = deduplicated["inference"]["jet_tagger"], every["inference"]["jet_tagger"]
    assert stats.repeat_calls == 3 * chunks and stats_without.repeat_calls == 0
    assert stats.repeat_rows == 3 * stats.rows // 2 > 0
    np.testing.assert_array_equal(deduplicated["scores"].values(), every["scores"].values())
    np.testing.assert_array_equal(deduplicated["scores"].variances(), every["scores"].variances())
    summary = "\n".join(r.getMessage() for r in caplog.records if "coffea-sonic run" in r.getMessage())
    assert (f"jet_tagger: {3 * chunks} call(s) of {stats.repeat_rows} rows answered by an "
            "identical call of the same chunk, no request sent") in summary, summary


def test_a_repeated_call_gets_its_own_copy_of_numpy_outputs(server):
    from coffea_sonic import repeats

    class Direct(SonicMixin):
        sonic_models = {"jet_tagger": f"triton+grpc://{server.grpc_address}/jet_tagger"}

    direct = Direct()
    rows = np.random.default_rng(1).normal(size=(50, 6)).astype(np.float32)
    with repeats.chunk_memo():
        first = direct.infer("jet_tagger", {"features": rows})["probs"]
        first[:] = -1.0  # the analysis changes its own array in place
        again = direct.infer("jet_tagger", {"features": rows})["probs"]
    outside = direct.infer("jet_tagger", {"features": rows})["probs"]
    np.testing.assert_array_equal(again, outside)
    assert direct.sonic_model("jet_tagger").stats.repeat_calls == 1
