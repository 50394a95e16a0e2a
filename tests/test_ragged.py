"""Ragged batching (coffea_sonic.ragged): groups of whole events, unpadded, with their counts.

Fast tests on the in-memory transport (grouping, alignment, every refusal), then a real
tritonserver serving a zoo-independent python-backend model written by
``repository.ragged_model_config``: over gRPC and shared memory the ragged calls equal one-event
requests to the same model (Triton's own per-request form, no counts) and a numpy reference,
and ``SonicMixin.infer(..., ragged=True)`` gives outputs aligned with the awkward input.
"""

from __future__ import annotations

import awkward as ak
import numpy as np
import pytest

from coffea_sonic import SonicMixin, TritonModel, ragged
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.errors import InferenceError, InputValidationError
from coffea_sonic.routing import clear_routers
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.repository import ragged_model_config, write_model
from coffea_sonic.transport.memory import MemoryTransport
from server_side import sent_over

#: The model, as numpy (shared by the in-memory engine and the served python model): per hit the
#: sum of its coordinates and its coordinates over (1 + |its event's sum|) (so a hit's answer
#: depends on which event it is in); per event the sum of its hits' coordinates and its hit count.
#: Sums are float64 bincounts in hit order, so an event's answer is bit-identical alone or grouped.
ANSWER_SOURCE = '''
def answer(hits, counts):
    event_of = np.repeat(np.arange(len(counts)), counts)
    hit_sum = hits.astype(np.float64).sum(axis=1)
    event_sum = np.bincount(event_of, weights=hit_sum, minlength=len(counts))
    scale = 1.0 + np.abs(event_sum)[event_of]
    return {
        "hit_sum": hit_sum.astype(np.float32),
        "hit_frac": (hits / scale[:, None]).astype(np.float32),
        "event_sum": event_sum.astype(np.float32)[:, None],
        "n_hits": np.asarray(counts, dtype=np.int64)[:, None],
    }
'''
namespace: dict = {"np": np}
exec(ANSWER_SOURCE, namespace)  # noqa: S102 - the test's own source, shared with the server
answer = namespace["answer"]

#: The python-backend model: a request with ``hits__counts`` is a group of events; one without
#: it is one event (what any Triton client sends one event at a time).
MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils
''' + ANSWER_SOURCE + '''

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            hits = pb_utils.get_input_tensor_by_name(request, "hits").as_numpy()[0]
            counts = pb_utils.get_input_tensor_by_name(request, "hits__counts")
            counts = (counts.as_numpy()[0] if counts is not None
                      else np.array([len(hits)], dtype=np.int64))
            out = answer(hits, counts)
            tensors = [pb_utils.Tensor(name, np.ascontiguousarray(out[name][None]))
                       for name in ("hit_sum", "hit_frac")]
            tensors += [pb_utils.Tensor(name, out[name]) for name in ("event_sum", "n_hits")]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
'''

HITS = TensorInfo("hits", "FP32", (3,))
OBJECT_OUTPUTS = (TensorInfo("hit_sum", "FP32", ()), TensorInfo("hit_frac", "FP32", (3,)))
EVENT_OUTPUTS = (TensorInfo("event_sum", "FP32", (1,)), TensorInfo("n_hits", "INT64", (1,)))

INFO = ModelInfo(
    "hitsum", ("1",), "python", 64,
    (TensorInfo("hits", "FP32", (-1, 3)), TensorInfo("hits__counts", "INT64", (-1,))),
    (TensorInfo("hit_sum", "FP32", (-1,)), TensorInfo("hit_frac", "FP32", (-1, 3)),
     *EVENT_OUTPUTS),
    ragged_inputs=("hits", "hits__counts"), ragged_outputs=("hit_sum", "hit_frac"))
PLAIN = ModelInfo("jet_tagger", ("1",), "python", 64, (TensorInfo("features", "FP32", (6,)),),
                  (TensorInfo("probs", "FP32", (3,)),))


def _group_engine(seen: list | None = None):
    """The in-memory model: the served convention, recording each request's (rows, counts)."""
    def engine(inputs):
        hits, counts = inputs["hits"], inputs["hits__counts"]
        assert hits.shape[0] == 1 and counts.shape[0] == 1 and counts.ndim == 2
        if seen is not None:
            seen.append((hits.shape[1], counts[0].copy()))
        out = answer(hits[0], counts[0])
        return {"hit_sum": out["hit_sum"][None], "hit_frac": out["hit_frac"][None],
                "event_sum": out["event_sum"], "n_hits": out["n_hits"]}
    return engine


def _memory_model(engine=None, info: ModelInfo = INFO, **options) -> tuple[TritonModel, MemoryTransport]:
    clear_routers()
    transport = MemoryTransport({info.name: (info, engine or _group_engine())}, address="mem:1")
    options.setdefault("retry", {"initial_backoff_s": 0.0, "jitter": 0.0})
    model = TritonModel(f"triton+grpc://mem:1/{info.name}",
                        transport=MemoryTransport.factory({"mem:1": transport}), **options)
    return model, transport


def _sample(events: int = 200, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Hits of ``events`` events: the first with 0, 1 and 40 hits, then 0 to 9 each."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 10, size=events).astype(np.int64)
    counts[:4] = [0, 1, 40, 0]
    hits = rng.normal(size=(int(counts.sum()), 3)).astype(np.float32)
    return hits, counts


def _per_event_reference(hits: np.ndarray, counts: np.ndarray) -> list[dict[str, np.ndarray]]:
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return [answer(hits[a:b], np.array([b - a])) for a, b in zip(offsets[:-1], offsets[1:])]


def _assert_equal_per_event(out: dict, hits: np.ndarray, counts: np.ndarray,
                            expected: list[dict[str, np.ndarray]] | None = None) -> None:
    expected = expected or _per_event_reference(hits, counts)
    assert out["hit_sum"].shape == (len(hits),) and out["hit_frac"].shape == (len(hits), 3)
    assert out["event_sum"].shape == (len(counts), 1) and out["n_hits"].shape == (len(counts), 1)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for event, reference in enumerate(expected):
        a, b = offsets[event], offsets[event + 1]
        np.testing.assert_array_equal(out["hit_sum"][a:b], reference["hit_sum"].reshape(-1))
        np.testing.assert_array_equal(out["hit_frac"][a:b], reference["hit_frac"].reshape(-1, 3))
        np.testing.assert_array_equal(out["event_sum"][event], reference["event_sum"].reshape(1))
        np.testing.assert_array_equal(out["n_hits"][event], reference["n_hits"].reshape(1))


# -- in memory ------------------------------------------------------------------------------------

def test_groups_of_whole_events_come_back_aligned_and_equal_per_event():
    hits, counts = _sample()
    seen: list = []
    model, _ = _memory_model(_group_engine(seen), max_request_bytes=400)
    out = model({"hits": hits}, counts=counts)
    _assert_equal_per_event(out, hits, counts)
    # several requests, each whole events: their counts concatenate to the call's
    assert len(seen) > 5 and model.stats.requests == len(seen)
    sent = sorted(seen, key=lambda item: item[1].tolist())  # answers arrive in any order
    assert sum(rows for rows, _ in sent) == len(hits)
    assert all(rows == int(c.sum()) for rows, c in seen)
    assert sum(len(c) for _, c in seen) == len(counts)
    assert model.stats.rows == len(counts)  # rows of a ragged call are events


def test_the_plan_never_cuts_an_event_and_balances_groups():
    hits, counts = _sample(events=1000)
    call = ragged.RaggedCall.build(INFO, {"hits": hits}, counts)
    cap = 2000
    plan = call.plan(cap)
    assert plan[0][0] == 0 and plan[-1][1] == len(counts)
    assert all(a[1] == b[0] for a, b in zip(plan, plan[1:]))  # contiguous, whole events
    sizes = [int(call.counts[a:b].sum()) * 12 + 8 * (b - a) for a, b, _ in plan]
    assert max(sizes) <= cap
    greedy = call._groups(call.counts * 12 + 8, np.cumsum(call.counts * 12 + 8), cap, None)
    assert len(plan) == len(greedy)
    assert max(sizes) - min(sizes) < 0.5 * cap  # no small, mostly fixed-cost last request


def test_an_event_over_the_request_cap_goes_alone(caplog):
    hits, counts = _sample(events=20)
    seen: list = []
    model, _ = _memory_model(_group_engine(seen), max_request_bytes=200)  # event 2: 40 hits, 488 B
    with caplog.at_level("INFO", logger="coffea_sonic.ragged"):
        out = model({"hits": hits}, counts=counts)
    _assert_equal_per_event(out, hits, counts)
    assert any(rows == 40 and c.tolist() == [40] for rows, c in seen)
    assert "sent alone" in caplog.text


def test_an_event_over_grpcs_limit_is_refused_before_sending(monkeypatch):
    hits, counts = _sample(events=20)
    monkeypatch.setattr(ragged, "HARD_REQUEST_LIMIT", 300)
    model, transport = _memory_model(max_request_bytes=200)
    with pytest.raises(InputValidationError, match=r"'hitsum': event 2 has 40 rows, 488 bytes; "
                                                   r"expected at most 300 bytes"):
        model({"hits": hits}, counts=counts)
    assert transport.requests == 0


@pytest.mark.parametrize("counts, why", [
    ([2, 2], r"model 'hitsum' input 'hits__counts': the counts of 2 events sum to 4 rows but 'hits' has 5"),
    ([2, 4], r"sum to 6 rows but 'hits' has 5"),
    ([6, -1], r"'hits__counts': expected counts >= 0, event 1 has -1"),
    ([[2, 3]], r"expected a 1-d integer array of rows per event, got shape \[1, 2\]"),
    ([2.0, 3.0], r"got shape \[2\] dtype float64"),
])
def test_counts_that_do_not_match_the_rows_are_refused(counts, why):
    model, transport = _memory_model()
    with pytest.raises(InputValidationError, match=why):
        model({"hits": np.zeros((5, 3), np.float32)}, counts=counts)
    assert transport.requests == 0


def test_wrong_inputs_of_a_ragged_call_are_refused_with_the_declaration():
    model, _ = _memory_model()
    with pytest.raises(InputValidationError, match=r"input 'hits': expected shape \[N, 3\], got "
                                                   r"\[5, 4\]"):
        model({"hits": np.zeros((5, 4), np.float32)}, counts=[5])
    with pytest.raises(InputValidationError, match="not a safe cast"):
        model({"hits": np.zeros((5, 3), np.float64)}, counts=[5])
    with pytest.raises(InputValidationError, match="filled by the client from counts="):
        model({"hits": np.zeros((5, 3), np.float32), "hits__counts": np.array([5])}, counts=[5])


def test_a_model_without_a_ragged_declaration_is_refused():
    model, transport = _memory_model(lambda inputs: {}, info=PLAIN)
    with pytest.raises(InputValidationError, match=r"model 'jet_tagger' declares no ragged input"):
        model({"features": np.zeros((3, 6), np.float32)}, counts=[1, 2])
    no_batching = ModelInfo("fixed", ("1",), "python", 0, INFO.inputs, INFO.outputs,
                            ragged_inputs=INFO.ragged_inputs, ragged_outputs=INFO.ragged_outputs)
    model, _ = _memory_model(lambda inputs: {}, info=no_batching)
    with pytest.raises(InputValidationError, match=r"model 'fixed' cannot take ragged calls: "
                                                   r"expected max_batch_size >= 1, it declares 0"):
        model({"hits": np.zeros((3, 3), np.float32)}, counts=[1, 2])
    assert transport.requests == 0
    # a ragged model without a counts input is Triton's own format: one request per event
    # (tests/test_ragged_batching.py, on a real server)


def test_a_ragged_model_called_without_counts_says_how():
    model, _ = _memory_model()
    with pytest.raises(InputValidationError, match=r"call model\(inputs, counts=rows_per_event\)"):
        model({"hits": np.zeros((5, 3), np.float32)})


@pytest.mark.parametrize("rewrite, why", [
    (lambda o: {**o, "event_sum": o["event_sum"][:-1]}, r"per-event output 'event_sum' has shape"),
    (lambda o: {**o, "hit_sum": o["hit_sum"][:, :-1]}, r"per-object output 'hit_sum' has shape"),
    (lambda o: {**o, "hit_sum": o["hit_sum"][0]}, r"expected \[1, \d+\]"),
    (lambda o: {k: v for k, v in o.items() if k != "n_hits"}, "lacks outputs"),
    (lambda o: {**o, "n_hits": o["n_hits"].astype(np.float32)}, "the model declares int64"),
])
def test_a_misaligned_answer_fails_the_call(rewrite, why):
    hits, counts = _sample(events=50)
    model, transport = _memory_model(max_request_bytes=300)
    transport.rewrite_next(rewrite)
    with pytest.raises(InferenceError, match=why):
        model({"hits": hits}, counts=counts)


def test_empty_calls_and_events_without_hits():
    model, transport = _memory_model()
    out = model({"hits": np.zeros((0, 3), np.float32)}, counts=np.zeros(0, np.int64))
    assert {name: a.shape for name, a in out.items()} == {
        "hit_sum": (0,), "hit_frac": (0, 3), "event_sum": (0, 1), "n_hits": (0, 1)}
    assert transport.requests == 0
    out = model({"hits": np.zeros((0, 3), np.float32)}, counts=[0, 0, 0])  # sent: per-event answers
    assert out["n_hits"].ravel().tolist() == [0, 0, 0] and out["hit_sum"].shape == (0,)


def test_a_busy_group_is_retried_and_the_call_stays_aligned():
    hits, counts = _sample()
    model, transport = _memory_model(max_request_bytes=500)
    transport.fail_next("busy", count=2)
    _assert_equal_per_event(model({"hits": hits}, counts=counts), hits, counts)
    assert model.stats.retries >= 1


def test_split_gives_each_events_outputs():
    hits, counts = _sample(events=10)
    call = ragged.RaggedCall.build(INFO, {"hits": hits}, counts)
    model, _ = _memory_model()
    per_event = call.split(model({"hits": hits}, counts=counts))
    assert [len(event["hit_sum"]) for event in per_event] == counts.tolist()
    assert [int(event["n_hits"][0]) for event in per_event] == counts.tolist()


class HitProcessor(SonicMixin):
    sonic_models = {"hitsum": "triton+grpc://mem:1/hitsum"}

    def process(self, hits):
        return self.infer("hitsum", {"hits": hits}, like=hits, ragged=True)


def _jagged(hits: np.ndarray, counts: np.ndarray) -> ak.Array:
    return ak.unflatten(ak.Array(hits), counts)  # [events][hits][3] (var * 3 * float32)


def test_the_mixin_sends_ragged_events_and_realigns_them():
    hits, counts = _sample(events=30)
    model, transport = _memory_model(max_request_bytes=300)
    processor = HitProcessor()
    processor.sonic_configure(transport=MemoryTransport.factory({"mem:1": transport}),
                              max_request_bytes=300)
    out = processor.process(_jagged(hits, counts))
    assert ak.num(out["hit_sum"]).tolist() == counts.tolist()
    assert ak.num(out["hit_frac"], axis=2).tolist() == [[3] * int(c) for c in counts]
    assert isinstance(out["event_sum"], np.ndarray) and out["event_sum"].shape == (30, 1)
    reference = _per_event_reference(hits, counts)
    for event, expected in enumerate(reference):
        assert ak.to_list(out["hit_sum"][event]) == expected["hit_sum"].tolist()
        assert out["n_hits"][event, 0] == counts[event]
    assert processor.sonic_stats()["hitsum"].rows == 30


def test_the_mixin_groups_the_innermost_lists_of_deeper_collections():
    # [events][jets][constituents][3]: each jet is one ragged unit; per-jet outputs [events][jets]
    hits, counts = _sample(events=12)
    jets_per_event = np.array([2, 0, 3, 1, 4, 2])
    constituents = ak.unflatten(_jagged(hits, counts), jets_per_event)
    model, transport = _memory_model()
    processor = HitProcessor()
    processor.sonic_configure(transport=MemoryTransport.factory({"mem:1": transport}))
    out = processor.infer("hitsum", {"hits": constituents}, ragged=True)
    assert ak.num(out["event_sum"]).tolist() == jets_per_event.tolist()
    assert ak.flatten(out["n_hits"], axis=1)[:, 0].tolist() == counts.tolist()
    assert ak.num(out["hit_sum"], axis=2).tolist() == ak.num(constituents, axis=2).tolist()


def test_the_mixin_sends_nothing_in_dask_awkwards_meta_pass():
    hits, counts = _sample(events=5)
    tracer = ak.Array(_jagged(hits, counts).layout.to_typetracer(forget_length=True))
    model, transport = _memory_model()
    processor = HitProcessor()
    processor.sonic_configure(transport=MemoryTransport.factory({"mem:1": transport}))
    out = processor.process(tracer)
    assert transport.requests == 0
    assert str(out["hit_frac"].type).endswith("var * 3 * float32")
    assert out["event_sum"].shape == (0, 1)


def test_the_mixin_needs_jagged_inputs_for_ragged_calls():
    model, transport = _memory_model()
    processor = HitProcessor()
    processor.sonic_configure(transport=MemoryTransport.factory({"mem:1": transport}))
    with pytest.raises(InputValidationError, match="ragged=True needs jagged inputs"):
        processor.infer("hitsum", {"hits": np.zeros((4, 3), np.float32)}, ragged=True)


# -- a real server ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("ragged-repository")
    config = ragged_model_config("hitsum", [HITS], OBJECT_OUTPUTS, EVENT_OUTPUTS,
                                 max_batch_size=64, index_input="hits__index")
    write_model(repository, config, {"model.py": MODEL_PY})
    plain = ragged_model_config("not_ragged", [HITS], OBJECT_OUTPUTS, EVENT_OUTPUTS)
    for tensor in plain.input:
        tensor.allow_ragged_batch = False
    del plain.batch_output[:]
    write_model(repository, plain, {"model.py": MODEL_PY})
    with LocalTritonServer(repository=repository, device="cpu") as server:
        yield server


def _one_event_requests(address: str, hits: np.ndarray, counts: np.ndarray) -> list[dict]:
    """Direct inference one event per request, as any Triton client sends it: [1, n, 3], no counts."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    answers = []
    for a, b in zip(offsets[:-1], offsets[1:]):
        tensor = grpcclient.InferInput("hits", [1, int(b - a), 3], "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(hits[a:b][None]))
        result = client.infer("hitsum", [tensor])
        answers.append({name: result.as_numpy(name) for name in
                        ("hit_sum", "hit_frac", "event_sum", "n_hits")})
    client.close()
    return answers


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_served_ragged_calls_equal_one_event_requests(ragged_server, transport):
    clear_routers()
    hits, counts = _sample(events=120)
    model = TritonModel(ragged_server.url("hitsum"), transport=transport, max_request_bytes=600)
    assert model.info.ragged_inputs == ("hits", "hits__counts")
    assert model.info.ragged_outputs == ("hit_sum", "hit_frac")
    with sent_over(transport, ragged_server) as wire:
        out = model({"hits": hits}, counts=counts)
    assert model.stats.requests > 5 and wire.grpc_infers == model.stats.requests
    direct = _one_event_requests(ragged_server.grpc_address, hits, counts)
    _assert_equal_per_event(out, hits, counts, direct)
    _assert_equal_per_event(out, hits, counts)  # and the numpy reference
    # an event over the cap goes alone; events without hits, alone or together, are answered
    model = TritonModel(ragged_server.url("hitsum"), transport=transport, max_request_bytes=100)
    with sent_over(transport, ragged_server):
        alone = model({"hits": hits[:41]}, counts=[0, 1, 40, 0])
    _assert_equal_per_event(alone, hits[:41], np.array([0, 1, 40, 0]))
    empty = model({"hits": np.zeros((0, 3), np.float32)}, counts=[0, 0])
    assert empty["n_hits"].ravel().tolist() == [0, 0] and empty["hit_frac"].shape == (0, 3)


def test_a_served_model_without_ragged_declaration_is_refused(ragged_server):
    clear_routers()
    model = TritonModel(ragged_server.url("not_ragged"), transport="grpc")
    assert model.info.ragged_inputs == () and model.info.ragged_outputs == ()
    with pytest.raises(InputValidationError, match=r"model 'not_ragged' declares no ragged input"):
        model({"hits": np.zeros((3, 3), np.float32)}, counts=[1, 2])


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_the_mixin_round_trip_on_a_served_model(ragged_server, transport):
    clear_routers()
    hits, counts = _sample(events=40)
    processor = HitProcessor()
    processor.sonic_configure({"hitsum": ragged_server.url("hitsum")}, transport=transport,
                              max_request_bytes=500)
    with sent_over(transport, ragged_server):
        out = processor.process(_jagged(hits, counts))
    assert ak.num(out["hit_sum"]).tolist() == counts.tolist()
    flat = {"hit_sum": ak.to_numpy(ak.flatten(out["hit_sum"])),
            "hit_frac": ak.to_numpy(ak.flatten(out["hit_frac"])),
            "event_sum": out["event_sum"], "n_hits": out["n_hits"]}
    _assert_equal_per_event(flat, hits, counts)


def _hits_model(row_dims: int) -> ModelInfo:
    return ModelInfo("hits_model", ("1",), "python", 8,
                     (TensorInfo("hits", "FP32", (-1, row_dims)),
                      TensorInfo("hits__counts", "INT64", (-1,))),
                     (TensorInfo("hit_sum", "FP32", (-1,)),),
                     ragged_inputs=("hits", "hits__counts"), ragged_outputs=("hit_sum",))


def test_a_changed_declaration_of_the_same_model_is_checked_against_the_new_one():
    """The ragged declaration is read once per model description: a new description of the
    same model (reloaded with other dims) is checked against its own dims, not the old ones."""
    rows = np.ones((5, 3), np.float32)
    three, four = _hits_model(3), _hits_model(4)
    for _ in range(2):
        call = ragged.RaggedCall.build(three, {"hits": rows}, [2, 3])
        assert call.plan(1 << 20) == [(0, 2, 0)]
    with pytest.raises(InputValidationError, match=r"expected shape \[N, 4\], got \[5, 3\]"):
        ragged.RaggedCall.build(four, {"hits": rows}, [2, 3])
    wider = ragged.RaggedCall.build(four, {"hits": np.ones((5, 4), np.float32)}, [2, 3])
    assert wider.tensors(0, 2)["hits"].shape == (1, 5, 4)
    assert ragged.RaggedCall.build(three, {"hits": rows}, [5, 0]).counts.tolist() == [5, 0]
