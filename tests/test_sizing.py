"""gRPC requests sized by this process's share of the server's work: small ones, many in flight,
while a process is the server's only client; the table's few large ones while others send too.
On a real server over gRPC; shared memory and HTTP keep their table defaults."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from coffea_sonic import ramp, sizing
from coffea_sonic.bench.passthrough import PASSTHROUGH, passthrough_inputs
from coffea_sonic.calls import Window
from coffea_sonic.hooks import CallHooks
from coffea_sonic.ramp import (HOLD_TURNAROUND_S, MAX_RETRY_CALLS, RETRY_CALLS, TailHold, ramped,
                               tail_start)
from coffea_sonic.validation import plan_pieces
from coffea_sonic.model import TritonModel
from coffea_sonic.sizing import ALONE, SHARED, ShareSizer
from helpers import wait_for

#: 6.4 MB: two requests at the shared shape (the model's 65 536-row batches), three alone.
ROWS = 100_000
DEADLINE_S = 60


def _requests_per_call(model: TritonModel, inputs: dict) -> int:
    before = model.stats.requests
    out = model(inputs)["y"]
    np.testing.assert_array_equal(out, inputs["x"][:, :2])
    return model.stats.requests - before


def test_the_shape_switches_with_the_share_and_holds_between_the_two_thresholds():
    server = {"count": 0}
    now = [0.0]
    sizer = ShareSizer(lambda: server["count"], interval_s=1.0, clock=lambda: now[0])

    def step(ours: int, others: int, answered: list[int] = [0]) -> object:  # noqa: B006
        now[0] += 10.0  # past the longest gap between reads
        answered[0] += ours
        server["count"] += ours + others
        return sizer.shape(answered[0])

    assert sizer.shape(0) == SHARED
    assert step(30, 0) == ALONE
    assert step(30, 15) == ALONE  # 67 %: between the thresholds, kept
    assert step(30, 40) == SHARED  # 43 %
    assert step(30, 15) == SHARED  # 67 %: kept
    assert step(4, 0) == SHARED  # too few requests to say
    assert step(30, 5) == ALONE


def test_a_server_whose_statistics_cannot_be_read_keeps_the_defaults_and_is_asked_seldom():
    reads, now, refusing = [], [0.0], [True]

    def count() -> int:
        reads.append(now[0])
        if refusing[0]:
            raise PermissionError("statistics restricted")
        return 50 * len(reads)

    sizer = ShareSizer(count, interval_s=0.25, clock=lambda: now[0])
    for tick in range(40):  # 10 s
        now[0] = tick * 0.25
        assert sizer.shape(0) == SHARED
    assert reads == [0.0, sizing.MAX_INTERVAL_S]
    refusing[0] = False  # readable again: the share decides once more
    now[0] = 16.0
    sizer.shape(0)
    now[0] = 16.25
    assert sizer.shape(50 * len(reads) + 100) == ALONE


def test_slow_calls_add_up_until_the_share_can_be_told():
    server, now = {"count": 0}, [0.0]
    sizer = ShareSizer(lambda: server["count"], interval_s=0.25, clock=lambda: now[0])
    answered = 0
    for _ in range(8):  # 3 requests of ours a second: under 8 per interval
        sizer.shape(answered)
        now[0] += 1.0
        answered += 3
        server["count"] += 3
    assert sizer.shape(answered) == ALONE


def test_a_window_resized_down_lets_its_requests_in_flight_finish_and_starts_no_more():
    started = []
    window = Window(8, started.append)
    window.submit(list(range(10)))
    assert len(started) == 8
    window.resize(2)
    for _ in range(6):
        window.release()
    assert len(started) == 8  # 2 in flight still: no more
    window.release()
    assert len(started) == 9
    window.release()
    assert len(started) == 10
    window.resize(8)
    assert window.limit == 8


def test_a_lone_process_sends_smaller_requests_and_shares_with_others_again(
        passthrough_server, monkeypatch):
    monkeypatch.setattr(sizing, "INTERVAL_S", 0.2)
    monkeypatch.setattr(sizing, "MAX_INTERVAL_S", 0.8)
    inputs = passthrough_inputs(ROWS)
    model = TritonModel(passthrough_server.url(PASSTHROUGH), transport="grpc")
    assert _requests_per_call(model, inputs) == 2
    # alone: 3 requests of at most ALONE's bytes, the first and last cut into pieces that double
    # from ramp.FIRST_BYTES and halve down to it (coffea_sonic.ramp)
    alone = plan_pieces(model.info, inputs, ROWS, ALONE.max_request_bytes)
    assert len(alone) == 3
    expected = len(ramped([(start, stop) for start, stop, _ in alone], inputs["x"].nbytes // ROWS))
    assert expected > 3
    wait_for(lambda: _requests_per_call(model, inputs) == expected, DEADLINE_S,
             "a lone process to send smaller requests, its first and last cut smaller")
    assert model._runtime.window.limit == ALONE.max_in_flight

    import tritonclient.grpc as grpcclient

    stop, errors = threading.Event(), []

    def another_client() -> None:
        client = grpcclient.InferenceServerClient(passthrough_server.grpc_address)
        try:
            tensor = grpcclient.InferInput("x", [1, 16], "FP32")
            tensor.set_data_from_numpy(passthrough_inputs(1)["x"])
            while not stop.is_set():
                client.infer(PASSTHROUGH, [tensor])
        except Exception as error:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(error)
        finally:
            client.close()

    thread = threading.Thread(target=another_client)
    thread.start()
    try:
        wait_for(lambda: errors or _requests_per_call(model, inputs) == 2, DEADLINE_S,
                 "a process sharing the server to send larger requests again")
    finally:
        stop.set()
        thread.join()
    if errors:
        raise errors[0]
    assert model._runtime.window.limit == SHARED.max_in_flight


@pytest.mark.parametrize("transport", ["shm", "http"])
def test_shared_memory_and_http_keep_their_table_defaults(passthrough_server, monkeypatch,
                                                          transport):
    monkeypatch.setattr(sizing, "INTERVAL_S", 0.0)
    inputs = passthrough_inputs(ROWS)
    url = (f"triton+http://{passthrough_server.http_address}/{PASSTHROUGH}"
           if transport == "http" else passthrough_server.url(PASSTHROUGH))
    model = TritonModel(url, transport=transport)
    first = _requests_per_call(model, inputs)
    assert model.transport_kind == transport
    assert [_requests_per_call(model, inputs) for _ in range(4)] == [first] * 4


def test_reads_grow_sparser_while_the_shape_holds_and_quicken_after_a_switch():
    reads, now = [], [0.0]

    def count() -> int:
        reads.append(now[0])
        return 100 * len(reads)  # this process's share stays 0 (it answers nothing)

    sizer = ShareSizer(count, interval_s=0.25, clock=lambda: now[0])
    while now[0] < 30:
        sizer.shape(0)
        now[0] += 0.125
    gaps = np.diff(reads).tolist()
    assert gaps[:5] == [0.25, 0.5, 1.0, 2.0, 4.0] and set(gaps[5:]) == {8.0}


class _Order(CallHooks):
    """Records, in order, each piece sent (``decorate``) and answered (``on_answer``)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def decorate(self, piece, request):
        with self.lock:
            self.events.append(("sent", piece.index))
        return request

    def on_answer(self, answer) -> None:
        with self.lock:
            self.events.append(("answered", answer.piece.index))


def test_a_lone_waiting_caller_sends_its_last_pieces_once_its_other_pieces_are_answered(
        passthrough_server, monkeypatch):
    monkeypatch.setattr(sizing, "INTERVAL_S", 0.2)
    monkeypatch.setattr(sizing, "MAX_INTERVAL_S", 0.8)
    # every round trip counts as short here, however loaded the machine: the order is tested
    monkeypatch.setattr(ramp, "HOLD_TURNAROUND_S", float(DEADLINE_S))
    inputs = passthrough_inputs(ROWS)
    model = TritonModel(passthrough_server.url(PASSTHROUGH), transport="grpc")
    alone = plan_pieces(model.info, inputs, ROWS, ALONE.max_request_bytes)
    spans = ramped([(start, stop) for start, stop, _ in alone], inputs["x"].nbytes // ROWS)
    held = range(tail_start(spans, alone[-1][0]) + 1, len(spans))
    assert len(held) >= 1
    wait_for(lambda: _requests_per_call(model, inputs) == len(spans), DEADLINE_S,
             "a lone process to ramp its calls")
    order = _Order()
    model.call_hooks = (*model.call_hooks, order)
    for _ in range(3):
        order.events.clear()
        np.testing.assert_array_equal(model(inputs)["y"], inputs["x"][:, :2])
        events = list(order.events)
        last_other = max(events.index(("answered", i)) for i in range(len(spans))
                         if i not in held)
        first_held = min(events.index(("sent", i)) for i in held)
        assert first_held > last_other, events
        assert [i for kind, i in events if kind == "sent" and i in held] == list(held)
    order.events.clear()
    handle = model.infer_async(inputs)  # a caller that does not wait holds nothing back
    np.testing.assert_array_equal(handle.result()["y"], inputs["x"][:, :2])
    assert not handle._call.holds


def test_a_long_round_trip_stops_the_hold_and_it_is_tried_again_later():
    hold = TailHold()
    assert hold.next_call()
    hold.answered(HOLD_TURNAROUND_S * 2)
    tries = [hold.next_call() for _ in range(3 * RETRY_CALLS)]
    assert tries.count(True) == 3 and tries[RETRY_CALLS - 1]
    hold.answered(HOLD_TURNAROUND_S / 2)
    assert all(hold.next_call() for _ in range(RETRY_CALLS))


def test_each_late_try_of_the_hold_doubles_the_calls_to_the_next_up_to_a_bound():
    hold = TailHold()
    assert hold.next_call()
    hold.answered(HOLD_TURNAROUND_S * 2)  # holding stops: tried again after RETRY_CALLS
    gaps = []
    while len(gaps) < 7:
        calls = 1
        while not hold.next_call():
            calls += 1
        gaps.append(calls)
        hold.answered(HOLD_TURNAROUND_S * 2)  # each try late again
    assert gaps == [RETRY_CALLS * 2 ** i for i in range(5)] + [MAX_RETRY_CALLS] * 2
    hold.answered(HOLD_TURNAROUND_S / 2)  # a short one: every call holds, the interval restarts
    assert all(hold.next_call() for _ in range(3))
    hold.answered(HOLD_TURNAROUND_S * 2)
    assert [hold.next_call() for _ in range(RETRY_CALLS)].index(True) == RETRY_CALLS - 1
