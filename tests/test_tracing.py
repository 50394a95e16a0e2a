"""One trace per chunk: every request carries a W3C ``traceparent``; a real tritonserver traced
with ``--trace-config mode=opentelemetry`` continues that trace (its spans, received over OTLP/HTTP
by tests/otlp_receiver.py, carry our trace id and name our span as parent), on every transport;
under coffea's Runner every call of a chunk, of every model, shares the chunk's trace id, which
the client logs with the chunk's dataset, file and entry range."""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Iterator

import numpy as np
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import TritonModel
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.server import LocalTritonServer
from helpers import wait_for
from server_side import sent_over
from otlp_receiver import OtlpReceiver, tracing_arguments

QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})
PARENT = re.compile(r"traceparent 00-([0-9a-f]{32})-([0-9a-f]{16})-01")
CHUNK = re.compile(r"chunk (\S+): trace ([0-9a-f]{32})")


@pytest.fixture(scope="module")
def traced() -> Iterator[tuple[LocalTritonServer, OtlpReceiver]]:
    with OtlpReceiver() as receiver, LocalTritonServer(
            models=["jet_tagger", "particlenet_lite"], device="cpu",
            extra_args=tracing_arguments(receiver)) as server:
        yield server, receiver


def _server_spans_under(receiver: OtlpReceiver, trace_id: str, span_id: str) -> list[dict]:
    """The server's request spans that name our span as their parent."""
    return [span for span in receiver.spans_of(trace_id) if span.get("parentSpanId") == span_id]


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_every_request_carries_the_calls_traceparent_into_the_servers_trace(
        traced: tuple[LocalTritonServer, OtlpReceiver], transport: str,
        caplog: pytest.LogCaptureFixture):
    server, receiver = traced
    url = (f"triton+http://{server.http_address}/jet_tagger" if transport == "http"
           else server.url("jet_tagger"))
    # three requests: 3 x 100 rows of 24 bytes
    model = TritonModel(url, transport=transport, max_request_bytes=2400, max_in_flight=1)
    inputs = {"features": np.random.default_rng(7).normal(size=(300, 6)).astype(np.float32)}
    caplog.set_level(logging.INFO, logger="coffea_sonic.tracing")
    with sent_over(transport, server) as wire:
        model(inputs)
    assert model.stats.requests == 3 and wire.grpc_infers + wire.http_infers == 3
    (parent,) = PARENT.findall(caplog.text)  # one call, one span, logged once
    trace_id, span_id = parent
    # Triton's HTTP endpoint continues the trace for every request; its gRPC endpoint now and then
    # starts a fresh root trace instead (about one request in 30 here, never over HTTP in 72)
    continued = 3 if transport == "http" else 1
    spans = wait_for(lambda: len(_server_spans_under(receiver, trace_id, span_id)) >= continued
                     and _server_spans_under(receiver, trace_id, span_id), 60,
                     lambda: f"{continued} server spans under {parent}; got "
                             f"{receiver.spans_of(trace_id)}")
    assert {span["name"] for span in spans} == {"InferRequest"}
    assert all(span.get("parentSpanId") == span_id for span in receiver.spans_of(trace_id)
               if span["name"] == "InferRequest")
    # and a second call is a new trace (outside a chunk, each call starts its own)
    caplog.clear()
    model(inputs)
    ((second, _),) = PARENT.findall(caplog.text)
    assert second != trace_id


def test_every_call_of_a_chunk_shares_the_chunks_trace_id_and_the_server_sees_it(
        traced: tuple[LocalTritonServer, OtlpReceiver], tmp_path,
        caplog: pytest.LogCaptureFixture):
    server, receiver = traced
    sample = write_sample(tmp_path, events=300, files=1, seed=3, datasets=["ttbar"])
    analysis = JetTaggingProcessor(f"triton+grpc://{server.grpc_address}")
    runner = processor.Runner(executor=processor.IterativeExecutor(status=False),
                              schema=QuietSchema, chunksize=100)
    caplog.set_level(logging.INFO, logger="coffea_sonic.tracing")
    runner({name: {"files": {path: "Events" for path in files}} for name, files in sample.items()},
           treename="Events", processor_instance=analysis)
    chunks = dict(CHUNK.findall(caplog.text))
    assert len(chunks) == 3 and len(set(chunks.values())) == 3, chunks
    assert all(label.startswith("ttbar:") and label.endswith(("0-100", "100-200", "200-300"))
               for label in chunks), chunks
    # both models' calls of a chunk carry its trace id, each call its own span
    calls: dict[str, set[str]] = defaultdict(set)
    for trace_id, span_id in PARENT.findall(caplog.text):
        calls[trace_id].add(span_id)
    assert set(calls) == set(chunks.values())
    assert all(len(spans) == 2 for spans in calls.values()), calls  # jet_tagger, particlenet_lite
    # Triton's gRPC endpoint now and then starts a fresh root trace for a request despite its
    # traceparent (see above; both calls of one chunk were seen so, once): the server continues
    # the traces of at least two of the three chunks, and only under our calls.
    def continued(trace_id: str) -> list[dict]:
        return [span for span in receiver.spans_of(trace_id) if span["name"] == "InferRequest"]

    wait_for(lambda: sum(bool(continued(trace_id)) for trace_id in calls) >= 2, 60,
             lambda: f"the server's spans of two of the chunks' traces {sorted(calls)}; got "
                     f"{ {trace_id: receiver.spans_of(trace_id) for trace_id in calls} }")
    for trace_id, spans in calls.items():
        assert all(span.get("parentSpanId") in spans for span in continued(trace_id)), (
            f"trace {trace_id}, calls {sorted(spans)}: {continued(trace_id)}")
