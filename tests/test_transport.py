"""Unit tests of the transport layer (no server): URLs, secrets, TLS options, codec, splitting,
validation and statistics; plus the in-flight window and header passing against a fake stub."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

from coffea_sonic.errors import ConfigurationError, InputValidationError
from coffea_sonic.model import TritonModel
from coffea_sonic.stats import InferenceStats, ServerStatistics
from coffea_sonic.core import Secret, TlsOptions, parse_model_url
from coffea_sonic.core.secrets import header_fingerprint, normalize_headers
from coffea_sonic.core.tensors import ModelInfo, TensorInfo
from coffea_sonic.transport.errors import TransportError, classify, from_grpc, to_sonic_error
from coffea_sonic.transport.grpc.codec import decode_response, encode_request
from coffea_sonic.transport.memory import MemoryTransport
from coffea_sonic.validation import (GRPC_MESSAGE_LIMIT, piece_arrays, plan_pieces,
                                               validate_inputs)
from helpers import pickled_class_names, wait_for

JET_INFO = ModelInfo("jet_tagger", ("1",), "python", 65536, (TensorInfo("features", "FP32", (6,)),),
                     (TensorInfo("probs", "FP32", (3,)),))


# -- URLs ------------------------------------------------------------------------------------------

def test_url_with_version_and_without_parses_like_coffea():
    pinned = parse_model_url("triton+grpc://127.0.0.1:8001/jet_tagger/2")
    latest = parse_model_url("triton+grpc://127.0.0.1:8001/jet_tagger")
    assert (pinned.address, pinned.model, pinned.version, pinned.tls) == (
        "127.0.0.1:8001", "jet_tagger", "2", False)
    assert latest.version == ""
    assert parse_model_url("triton+grpcs://h:443/m").tls


@pytest.mark.parametrize("url, fragment", [
    ("grpc://h:1/m", "scheme 'grpc'"),
    ("triton+grpc://h:1/", "expected /model"),
    ("triton+grpc://h:1/a/1/extra", "expected /model"),
    ("triton+grpc://h:1/m/latest", "positive integer"),
    ("triton+grpc://h:1/m/0", "positive integer"),
    ("triton+grpc://:1/m", "no host"),
    ("triton+grpc://h:99999/m", "malformed"),
    ("triton+grpc://user:pw@h:1/m", "credentials"),
    ("triton+grpc://h:1/m?x=1", "query"),
])
def test_malformed_url_raises_configuration_error(url, fragment):
    with pytest.raises(ConfigurationError) as caught:
        parse_model_url(url)
    assert fragment in str(caught.value)


# -- secrets ---------------------------------------------------------------------------------------

def test_literal_token_is_redacted_everywhere_and_never_pickled():
    model = TritonModel("triton+grpc://127.0.0.1:1/jet_tagger",
                        headers={"Authorization": "Bearer top-secret-token"})
    assert "top-secret" not in repr(model)
    assert "top-secret" not in repr(model.headers)
    blob = pickle.dumps(model)
    assert b"top-secret" not in blob
    # same process (or a forked child): the handle finds the value again
    assert pickle.loads(blob).headers["authorization"].reveal() == "Bearer top-secret-token"


def test_literal_token_in_a_fresh_process_asks_for_an_env_variable():
    blob = pickle.dumps(Secret("Bearer top-secret-token"))
    code = ("import pickle,sys\n"
            "secret = pickle.loads(sys.stdin.buffer.read())\n"
            "try:\n    secret.reveal()\nexcept Exception as error:\n    print(type(error).__name__, error)\n")
    result = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                            timeout=60)
    text = result.stdout.decode()
    assert "ConfigurationError" in text and "from_env" in text
    assert "top-secret" not in text + result.stderr.decode()


def test_env_token_pickles_only_the_variable_name(monkeypatch):
    monkeypatch.setenv("SONIC_TEST_TOKEN", "jwt-value-123")
    secret = Secret.bearer_from_env("SONIC_TEST_TOKEN")
    blob = pickle.dumps(secret)
    assert b"jwt-value-123" not in blob and b"SONIC_TEST_TOKEN" in blob
    assert pickle.loads(blob).reveal() == "Bearer jwt-value-123"
    monkeypatch.delenv("SONIC_TEST_TOKEN")
    with pytest.raises(ConfigurationError, match="SONIC_TEST_TOKEN"):
        secret.reveal()


def test_sensitive_plain_headers_become_secrets_and_fingerprints_hide_values():
    headers = normalize_headers({"X-Api-Key": "k1", "X-Trace": "abc"})
    assert isinstance(headers["x-api-key"], Secret) and headers["x-trace"] == "abc"
    assert "k1" not in header_fingerprint(headers)
    assert header_fingerprint(headers) != header_fingerprint(normalize_headers({"X-Api-Key": "k2"}))


def test_tls_options_need_both_client_cert_and_key():
    with pytest.raises(ConfigurationError, match="both"):
        TlsOptions(certificate_chain="/c.pem")
    with pytest.raises(ConfigurationError, match="unknown TLS option"):
        TlsOptions.coerce({"ca": "/x"})
    assert TritonModel("triton+grpcs://h:1/m").tls == TlsOptions()
    with pytest.raises(ConfigurationError, match="ssl=False"):
        TritonModel("triton+grpcs://h:1/m", ssl=False)


# -- codec, validation, splitting ------------------------------------------------------------------

def test_codec_round_trips_numeric_and_bytes_tensors():
    from tritonclient.grpc import service_pb2

    values = {"f": np.arange(6, dtype=np.float32).reshape(2, 3),
              "s": np.array([[b"ab"], [b"c"]], dtype=object)}
    request = encode_request("m", "1", values)
    response = service_pb2.ModelInferResponse(model_name="m")
    for tensor in request.inputs:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    response.raw_output_contents.extend(request.raw_input_contents)
    decoded = decode_response(response)
    np.testing.assert_array_equal(decoded["f"], values["f"])
    assert decoded["s"].tolist() == [[b"ab"], [b"c"]]


def test_safe_casts_pass_and_lossy_casts_name_model_tensor_and_types():
    arrays, rows = validate_inputs(JET_INFO, {"features": np.ones((3, 6), np.int16)})
    assert arrays["features"].dtype == np.float32 and rows == 3
    with pytest.raises(InputValidationError) as caught:
        validate_inputs(JET_INFO, {"features": np.ones((3, 6), np.float64)})
    message = str(caught.value)
    assert all(word in message for word in ("jet_tagger", "features", "float32", "float64"))


def test_nonfinite_policy_pass_or_raise():
    values = {"features": np.full((2, 6), np.nan, np.float32)}
    assert validate_inputs(JET_INFO, values)[1] == 2
    with pytest.raises(InputValidationError, match="12 NaN/inf"):
        validate_inputs(JET_INFO, values, nonfinite="raise")


def test_pieces_cover_rows_in_order_by_batch_size_and_bytes():
    arrays, rows = validate_inputs(JET_INFO, {"features": np.zeros((200_000, 6), np.float32)})
    by_batch = plan_pieces(JET_INFO, arrays, rows, max_request_bytes=1 << 30)
    # at most max_batch_size rows, in equal pieces (no small tail request)
    assert [stop - start for start, stop, _ in by_batch] == [50000, 50000, 50000, 50000]
    small, _ = validate_inputs(JET_INFO, {"features": np.zeros((2048, 6), np.float32)})
    uneven = plan_pieces(JET_INFO, small, 2048, 24 * 1800)
    assert [stop - start for start, stop, _ in uneven] == [1024, 1024]
    by_bytes = plan_pieces(JET_INFO, arrays, rows, max_request_bytes=24 * 1000)
    assert all(stop - start <= 1000 for start, stop, _ in by_bytes)
    flat = [row for start, stop, pad in by_bytes for row in range(start, stop)]
    assert flat == list(range(rows)) and all(pad == 0 for *_, pad in by_bytes)


def test_call_larger_than_grpc_limit_is_split_below_it():
    info = ModelInfo("big", ("1",), "python", 1 << 20, (TensorInfo("x", "FP32", (1 << 20,)),),
                     (TensorInfo("y", "FP32", (1,)),))
    huge = {"x": np.broadcast_to(np.float32(0), (1000, 1 << 20))}  # 4 GiB, never allocated
    pieces = plan_pieces(info, huge, 1000, max_request_bytes=GRPC_MESSAGE_LIMIT)
    assert len(pieces) >= 2
    assert all((stop - start) * 4 * (1 << 20) < GRPC_MESSAGE_LIMIT for start, stop, _ in pieces)
    with pytest.raises(ConfigurationError, match="max_request_bytes"):
        TritonModel("triton+grpc://h:1/m", max_request_bytes=3 << 30)


def test_fixed_batch_models_without_batching_get_zero_padding_only_at_the_end():
    info = ModelInfo("fixed", ("1",), "python", 0, (TensorInfo("x", "FP32", (8, 4)),),
                     (TensorInfo("y", "FP32", (8, 4)),))
    arrays = {"x": np.ones((20, 4), np.float32)}
    pieces = plan_pieces(info, arrays, 20, 1 << 20)
    assert pieces == [(0, 8, 0), (8, 16, 0), (16, 20, 4)]
    last = piece_arrays(arrays, 16, 20, 4)["x"]
    assert last.shape == (8, 4) and last[:4].all() and not last[4:].any()


# -- statistics ------------------------------------------------------------------------------------

def test_stats_sum_like_coffea_accumulators():
    from coffea.processor import accumulate

    parts = [{"jet_tagger": InferenceStats(requests=1, rows=10, wait_s=0.5)} for _ in range(3)]
    total = accumulate(parts)["jet_tagger"]
    assert (total.requests, total.rows, total.wait_s) == (3, 30, 1.5)
    assert sum([InferenceStats(rows=1), InferenceStats(rows=2)]).rows == 3
    delta = ServerStatistics(inference_count=9, execution_count=3) - ServerStatistics()
    assert delta.average_batch == 3.0


def test_one_classifier_decides_what_a_failure_means():
    def kind(code, details=""):
        return classify(code, details)

    assert kind("UNAVAILABLE") == "down" and kind("DEADLINE_EXCEEDED") == "timeout"
    assert kind("RESOURCE_EXHAUSTED") == "busy"
    assert kind("UNAVAILABLE", "Exceeds maximum queue size") == "busy"
    assert kind("INTERNAL", "Connection reset by peer") == "down"
    assert kind("INVALID_ARGUMENT") == "bad_request" and kind("NOT_FOUND") == "not_found"
    assert kind("INTERNAL", "inference failed: ValueError") == "internal"
    assert kind("CANCELLED", "Locally cancelled by application!") == "cancelled"
    assert kind("UNAVAILABLE", "This protocol is restricted, expecting header "
                "'triton-grpc-protocol-k'") == "restricted"
    # a region the server does not know is never a missing model
    assert kind("NOT_FOUND", "Unable to find shared memory region: 'x'") == "shm_region"
    assert not TransportError("bad_request", "x").retryable
    assert "a:1" in str(to_sonic_error(from_grpc(ValueError("x"), "a:1"), model="m"))


# -- pickling and the window on the in-memory transport ---------------------------------------------

def test_pickle_of_a_fresh_model_has_no_grpc_class():
    model = TritonModel("triton+grpc://127.0.0.1:1/jet_tagger", headers={"x-trace": "1"})
    names = pickled_class_names(pickle.dumps(model))
    assert not [name for name in names if "grpc" in name.split(" ")[0] or "triton" in name]


class _CountingTransport(MemoryTransport):
    """In-memory jet_tagger whose answers take a while, counting requests in flight."""

    def __init__(self):
        super().__init__({"jet_tagger": (JET_INFO, self._probs)}, address="127.0.0.1:1")
        self.lock, self.now, self.peak = threading.Lock(), 0, 0
        self.release = threading.Event()

    def _probs(self, inputs):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            # hold every answer until the window is full (or the test gave up waiting)
            wait_for(lambda: self.peak >= 3 or self.release.is_set(), timeout=10,
                     what="three requests in flight")
        finally:
            with self.lock:
                self.now -= 1
        return {"probs": inputs["features"][:, :3].copy()}


def test_window_bounds_requests_in_flight_and_keeps_row_order():
    transport = _CountingTransport()
    model = TritonModel("triton+grpc://127.0.0.1:1/jet_tagger", max_in_flight=3,
                        max_request_bytes=24 * 10, transport=lambda settings: transport)
    features = np.arange(100 * 6, dtype=np.float32).reshape(100, 6)
    handles = [model.infer_async({"features": features}) for _ in range(3)]
    for handle in handles:
        np.testing.assert_array_equal(handle.result()["probs"], features[:, :3])
    transport.close()
    assert transport.peak == 3
    assert model.stats.requests == 30 and model.stats.rows == 300


def test_headers_and_the_protocol_key_go_to_every_server():
    seen = []

    def factory(settings):
        seen.append(dict(settings.metadata()))
        return MemoryTransport({"jet_tagger": (JET_INFO, lambda i: {"probs": i["features"][:, :3]})},
                               address=settings.address)

    model = TritonModel(["triton+grpc://a:1/jet_tagger", "triton+grpc://b:1/jet_tagger"],
                        headers={"authorization": "Bearer t0k", "x-trace": "run7"},
                        protocol_key=("k", Secret("v")), transport=factory)
    assert "protocol_key='k'" in repr(model) and "t0k" not in repr(model)
    model({"features": np.zeros((25, 6), np.float32)})
    assert seen and all(m == {"authorization": "Bearer t0k", "x-trace": "run7",
                              "triton-grpc-protocol-k": "v"} for m in seen)
