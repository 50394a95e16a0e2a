"""The tracking example (issue 13 item 6): TrackingProcessor on the real embedded tritonserver,
through coffea's Runner and real Dask workers, against the in-process pipeline.

Identical labels give identical metrics: the processor's totals are the direct run's, and its
labels stay aligned with the events when some (or all) events of a chunk have no hit.
"""

from __future__ import annotations

import awkward as ak
import numpy as np
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

from coffea_sonic.data import write_sample
from coffea_sonic.data.hits import generate_hits, hit_rows
from coffea_sonic.errors import InputValidationError
from coffea_sonic.examples.tracking import TrackingProcessor, summarise_tracking
from coffea_sonic.zoo import trackgnn

pytestmark = pytest.mark.filterwarnings("ignore:Missing cross-reference")

#: Not the training seed (0) nor test_trackgnn's.
SEED = 31_415
QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})


@pytest.fixture(scope="module")
def server(trackgnn_server):
    return trackgnn_server


def _events_with_empty_ones() -> ak.Array:
    """Events of 0 hits, 1 hit, 0 hits, then busy ones (one empty in the middle), as records
    with a ``Hit`` collection like NanoEvents'."""
    drawn = generate_hits(12, seed=SEED)
    hits = ak.unflatten(ak.zip(drawn["fields"]), drawn["counts"])
    lone = hits[ak.num(hits) > 0][:1, :1]
    empty = hits[:1, :0]
    parts = [empty, lone, empty, hits[:6], empty, hits[6:]]
    return ak.zip({"Hit": ak.concatenate(parts)}, depth_limit=1)


def test_processor_totals_through_runner_and_dask_equal_the_direct_run(server, tmp_path):
    from coffea_sonic.facility.cluster import make_cluster

    fileset = write_sample(tmp_path, events=150, files=1, seed=SEED, datasets=["ttbar"])
    with make_cluster("local", workers=1) as cluster:
        # retries=0: coffea's default (3) would rerun a failing chunk and hide the first failure
        runner = processor.Runner(executor=processor.DaskExecutor(client=cluster.client,
                                                                  status=False, retries=0),
                                  schema=QuietSchema, chunksize=50)
        assert runner.retries == 0
        output = runner({name: {"files": {path: "Events" for path in files}}
                         for name, files in fileset.items()}, treename="Events",
                        processor_instance=TrackingProcessor(
                            f"triton+grpc://{server.grpc_address}"))
    events = NanoEventsFactory.from_root({fileset["ttbar"][0]: "Events"}, schemaclass=QuietSchema,
                                         mode="eager").events()
    rows, counts = hit_rows(events.Hit)
    direct = trackgnn.track_metrics(trackgnn.run_direct(rows, counts),
                                    ak.to_numpy(ak.flatten(events.Hit.track_id)), counts)
    assert output["cutflow"]["ttbar"] == {
        "events": 150, "hits": len(rows), "true_tracks": direct.true_tracks,
        "reco_tracks": direct.reco_tracks, "found": direct.found, "matched": direct.matched}
    summary = summarise_tracking(output, wall_s=1.0)
    assert summary["efficiency"] == round(direct.efficiency, 4) > 0.9
    assert summary["purity"] == round(direct.purity, 4) > 0.9
    stats = output["inference"]["trackgnn"]
    assert stats.requests >= 3 and stats.fallback_rows == 0  # one request per chunk at least
    histograms = output["histograms"]
    assert histograms["true_tracks"].sum(flow=True) == direct.true_tracks  # pT > 10 GeV: overflow
    assert histograms["true_tracks"][{"dataset": sum, "found": True}].sum(flow=True) == direct.found
    assert histograms["reco_tracks"][{"dataset": sum, "matched": True}].sum() == direct.matched
    assert histograms["hits_per_event"].sum(flow=True) == 150


@pytest.mark.parametrize("ensemble", [False, True], ids=["fused", "ensemble"])
def test_labels_stay_aligned_when_events_have_no_hits(server, ensemble):
    events = _events_with_empty_ones()
    tracking = TrackingProcessor(f"triton+grpc://{server.grpc_address}", ensemble=ensemble,
                                 max_request_bytes=4000)  # many requests per chunk
    labels = tracking.track_labels(events)
    rows, counts = hit_rows(events.Hit)
    assert ak.num(labels).tolist() == counts.tolist()
    assert counts[:3].tolist() == [0, 1, 0] and counts[9] == 0
    np.testing.assert_array_equal(ak.to_numpy(ak.flatten(labels)),
                                  trackgnn.run_direct(rows, counts))
    output = tracking.process(events)
    assert tracking.sonic_model(tracking.model).stats.requests >= 4
    assert output["cutflow"]["unknown"]["events"] == len(counts)
    assert output["cutflow"]["unknown"]["hits"] == len(rows)
    nothing = tracking.process(events[ak.num(events.Hit) == 0])
    assert nothing["cutflow"]["unknown"] == {"events": int((counts == 0).sum()), "hits": 0,
                                             "true_tracks": 0, "reco_tracks": 0, "found": 0,
                                             "matched": 0}


def test_events_without_hits_collection_are_refused_with_what_to_use():
    tracking = TrackingProcessor("triton+grpc://127.0.0.1:1")
    with pytest.raises(InputValidationError, match="coffea-sonic sample"):
        tracking.track_labels(ak.zip({"Jet": ak.Array([[{"pt": 1.0}]])}, depth_limit=1))


def test_tracking_demo_refuses_files_without_hits_before_starting_anything(tmp_path, monkeypatch):
    import uproot

    from coffea_sonic import demo

    path = tmp_path / "jets_only.root"
    with uproot.recreate(path) as handle:
        handle["Events"] = {"nJet": np.array([1, 2], dtype=np.int32)}

    def no_server(*args, **kwargs):
        raise AssertionError("the server must not start for files without hits")

    monkeypatch.setattr(demo, "_start_server", no_server)
    args = demo.build_parser().parse_args(["--analysis", "tracking", "--files", str(path),
                                           "--output", str(tmp_path / "out")])
    with pytest.raises(InputValidationError, match="jets_only.root.*coffea-sonic sample"):
        demo.run(args)
