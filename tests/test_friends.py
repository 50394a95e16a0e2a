"""Friend columns on the real path: a coffea ``Runner`` run asks a real tritonserver for every
jet's b score and writes it beside the data; a second run with another chunk size reads the
friends back (no server at all) and fills the identical histogram."""

from __future__ import annotations

import doctest

import awkward as ak
import hist
import numpy as np
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import SonicMixin, columns
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.server import LocalTritonServer

import friends as friends_module
from friends import FriendColumns

SCHEMA = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})


class Scores(SonicMixin, processor.ProcessorABC):
    """b scores of jets above 15 GeV: from the server (and written), or from the friends."""

    def __init__(self, server: str, friends: FriendColumns, *, read: bool) -> None:
        self.sonic_configure({"jet_tagger": f"{server}/jet_tagger"})
        self.friends, self.read = friends, read
        # reading the friends back needs no server: nothing to check before the run
        self.sonic_preflight = not read

    def process(self, events):
        jets = events.Jet[events.Jet.pt > 15]
        if self.read:
            stored = self.friends.read(events)
            assert stored is not None, f"no friends for {events.metadata}"
            b_score = stored["b_score"]
        else:
            b_score = self.infer("jet_tagger", {"features": columns.jet_features(jets)},
                                 like=jets)["probs"][:, :, 0]
            self.friends.write(events, {"b_score": b_score})
        histogram = hist.Hist(hist.axis.Regular(40, 0, 1, name="b"))
        histogram.fill(b=ak.to_numpy(ak.flatten(b_score)))
        return {"b": histogram, "events": len(events)}

    def postprocess(self, accumulator):
        return accumulator


def _run(fileset, analysis, chunksize):
    return processor.Runner(executor=processor.IterativeExecutor(), schema=SCHEMA,
                            chunksize=chunksize)(
        {name: {"files": {path: "Events" for path in files}} for name, files in fileset.items()},
        treename="Events", processor_instance=analysis)


def test_friend_columns_written_once_are_read_back_with_another_chunk_size(tmp_path):
    fileset = write_sample(tmp_path / "sample", events=3000, files=1)
    friends = FriendColumns(tmp_path / "friends")
    with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
        written = _run(fileset, Scores(f"triton+grpc://{server.grpc_address}", friends,
                                       read=False), chunksize=1000)
    # the server is gone: the second run can only read the friends
    read = _run(fileset, Scores("triton+grpc://127.0.0.1:1", friends, read=True), chunksize=700)
    assert read["events"] == written["events"] == 6000
    np.testing.assert_array_equal(read["b"].values(), written["b"].values())
    assert written["b"].sum() > 1000
    assert len(list((tmp_path / "friends").rglob("*.parquet"))) == 6


def test_friend_pieces_overlapping_a_range_are_joined_and_a_gap_reads_none():
    """The module's examples: pieces written for two ranges are read back for a third that
    straddles them; a range with an entry never written reads None."""
    failed, attempted = doctest.testmod(friends_module)
    assert attempted and not failed
