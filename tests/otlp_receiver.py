"""A minimal OTLP/HTTP trace receiver for tests: what a tritonserver exports with
``--trace-config mode=opentelemetry`` (Debian has no OpenTelemetry collector).

It accepts ``POST /v1/traces`` in OTLP's JSON encoding (what the bundled tritonserver sends) and
keeps every span: ``receiver.spans`` is a list of dicts with ``traceId``, ``spanId``,
``parentSpanId``, ``name`` and ``attributes``. A protobuf body is kept raw in ``receiver.raw``
(its trace ids can still be found in it as bytes)."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver._take(self.headers.get("content-type", ""), body)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> "OtlpReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _take(self, content_type: str, body: bytes) -> None:
        with self._lock:
            self.raw.append(body)
            if "json" not in content_type:
                return
            for resource in json.loads(body).get("resourceSpans", []):
                for scope in resource.get("scopeSpans", []):
                    self.spans.extend(scope.get("spans", []))

    def spans_of(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans received so far with ``trace_id``."""
        with self._lock:
            return [span for span in self.spans if span.get("traceId") == trace_id]

    def trace_ids(self) -> set[str]:
        with self._lock:
            return {span.get("traceId", "") for span in self.spans}


def tracing_arguments(receiver: OtlpReceiver) -> list[str]:
    """tritonserver arguments that trace every request and export the spans to ``receiver``."""
    return ["--trace-config=mode=opentelemetry",
            f"--trace-config=opentelemetry,url={receiver.url}",
            "--trace-config=rate=1", "--trace-config=level=TIMESTAMPS",
            "--trace-config=opentelemetry,bsp_max_export_batch_size=1"]
