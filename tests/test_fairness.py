"""Several users on one server: per-request priorities reach Triton on every transport and its
batcher honours them, and ``coffea-sonic bench fairness --quick`` (8 user processes, one with
ten times the load) serves every user completely and judges its fairness goals.

The priority tests hold Triton's batcher (``TRITONSERVER_DELAY_SCHEDULER=3``: it starts only once
three requests wait) so that two requests of priority 2 and then one of priority 1 are all queued
before any runs; with one request per execution the priority-1 request must be executed first.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from coffea_sonic.bench.fairness import GOALS, PRESETS
from coffea_sonic.cli import main
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.facility.monitor import scrape
from coffea_sonic.model import TritonModel
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.repository import QueuePolicy
from helpers import CheckedThread, wait_for

MODEL = "jet_tagger"
ROWS = 512


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "1"])
def test_priority_must_be_a_level(bad):
    with pytest.raises(ConfigurationError, match="priority must be an int >= 1"):
        TritonModel("triton+grpc://127.0.0.1:1/jet_tagger", priority=bad)
    assert "priority=3" in repr(TritonModel("triton+grpc://127.0.0.1:1/jet_tagger", priority=3))


def _held_server(monkeypatch, trace: Path) -> LocalTritonServer:
    """A server whose batcher waits for three queued requests, one request per execution, and
    that traces every request's timestamps (Triton's own trace: one file per request)."""
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "3")
    server = LocalTritonServer(models=[MODEL], device="cpu", instances=1, repository_options={
        "priority_levels": 2, "preferred_batch_sizes": [ROWS], "max_queue_delay_microseconds": 0,
        "queue_policies": {1: QueuePolicy(), 2: QueuePolicy()}}, extra_args=[
        f"--trace-config=triton,file={trace}", "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1", "--trace-config=count=-1",
        "--trace-config=triton,log-frequency=1"])
    server.start()
    monkeypatch.delenv("TRITONSERVER_DELAY_SCHEDULER")
    return server


def _traced_requests(trace: Path) -> list[dict[str, int]]:
    """Each traced inference request's timestamps (name -> ns), from Triton's trace files."""
    requests: dict[tuple[str, int], dict[str, int]] = {}
    for path in sorted(trace.parent.glob(trace.name + ".*")):
        for entry in json.loads(path.read_text()):
            for stamp in entry.get("timestamps", ()):
                requests.setdefault((path.name, entry["id"]), {})[stamp["name"]] = stamp["ns"]
    return [stamps for stamps in requests.values() if "COMPUTE_START" in stamps]


def _order_of_execution(transport: str, monkeypatch, trace: Path) -> list[str]:
    """Two priority-2 requests held in the queue, then one of priority 1: the requests in the
    order the server's model instance executed them, each named by the order it was queued in."""
    server = _held_server(monkeypatch, trace)
    try:
        url = (f"triton+http://{server.http_address}/{MODEL}" if transport == "http"
               else server.url(MODEL))
        clients = {priority: TritonModel(url, transport=transport, priority=priority,
                                         max_in_flight=2) for priority in (1, 2)}
        features = np.random.default_rng(0).normal(size=(ROWS, 6)).astype(np.float32)
        for client in clients.values():
            client.info  # metadata now, so that only inference requests reach the batcher

        def send(priority: int) -> None:
            assert clients[priority]({"features": features})["probs"].shape == (ROWS, 3)

        def pending() -> float:
            return scrape(server.metrics_url).models[(MODEL, "1")].pending

        low = [CheckedThread(send, 2, name=f"low{i}") for i in range(2)]
        for thread in low:
            thread.start()
        # both low-priority requests wait in the held queue before the high-priority one is sent
        wait_for(lambda: pending() == 2, timeout=60, what="two queued low-priority requests")
        send(1)
        for thread in low:
            thread.finish(timeout=120)
        assert all(client.transport_kind == transport for client in clients.values())
        # a file is written once a request's trace is complete, just after its answer
        requests = wait_for(lambda: found if len(found := _traced_requests(trace)) == 3 else None,
                            timeout=30, what=f"three traced requests in {trace.parent}",
                            ignoring=(ValueError,))
    finally:
        server.stop()
    queued = sorted(requests, key=lambda stamps: stamps["QUEUE_START"])
    names = {id(stamps): name for stamps, name in zip(queued, ("low", "low", "high"))}
    return [names[id(stamps)] for stamps in sorted(requests, key=lambda s: s["COMPUTE_START"])]


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_a_higher_priority_request_overtakes_queued_ones(transport, monkeypatch, tmp_path):
    # The order is read from the server's trace, not from when the answers reached the client:
    # on a loaded 2-core machine a client thread may wake milliseconds after its answer arrived,
    # later than the next execution takes. Without the priority the held queue is first come,
    # first served, and the high-priority request would run last.
    assert _order_of_execution(transport, monkeypatch, tmp_path / "trace.json") == [
        "high", "low", "low"]


def test_fairness_scenario_serves_every_user_completely_and_records_its_goals(tmp_path,
                                                                            monkeypatch, capsys):
    # The command as users run it (``--quick``), with the quick preset's phases shortened: the
    # goals are figures of the benchmark (it checks them, records them and exits 1 when one is
    # missed; RESULTS.md has the runs), not of this test, which checks what every run must do.
    quick = replace(PRESETS["quick"], rounds=1, solo_s=3.0, contended_s=3.0, saturate_s=4.0)
    monkeypatch.setitem(PRESETS, "quick", quick)
    output = tmp_path / "fairness"
    code = main(["bench", "fairness", "--quick", "-o", str(output)])
    printed = capsys.readouterr().out
    results = json.loads((output / "results.json").read_text())
    figures = results["fairness"]
    assert results["config"] == {**results["config"], "users": 8, "heavy_factor": 10,
                                 "preset": "quick", "policy": "fair", "rounds": 1}
    assert PRESETS["quick"].users == 8
    # every request of every user came back complete and right (the server refuses the heavy
    # user's extra concurrency at times, and its client sends those requests again)
    assert figures["failed_requests"] == {"solo": 0, "contended": 0, "saturate": 0}
    assert len(figures["goodput_rows_per_s"]) == 8 and min(figures["goodput_rows_per_s"]) > 0
    assert len(figures["light_p95_ratio_by_round"]) == 1
    # each goal is judged on the figure it names, and the exit status follows the verdict
    assert set(figures["goals"]) == set(GOALS)
    for name, (op, bound) in GOALS.items():
        assert figures["goals"][name] == {
            "goal": f"{op} {bound}",
            "met": figures[name] >= bound if op == ">=" else figures[name] <= bound}, name
    assert figures["met"] == all(goal["met"] for goal in figures["goals"].values())
    assert code == (0 if figures["met"] else 1), printed
    assert "bench fairness (quick, policy fair) finished in" in printed
