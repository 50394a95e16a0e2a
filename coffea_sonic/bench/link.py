"""One default TritonModel across a shaped link: goodput against raw TCP, with and without compression.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from .clients import fresh_clients
from .files import table, write_report
from .machine import load_lines, machine_title, stamped
from .passthrough import PASSTHROUGH, passthrough_inputs, write_passthrough

__all__ = ["LinkBench", "call_phases", "compressibility", "markdown", "parse_links", "run_link",
           "write_link"]

#: A TCP sink on the lab host: raw TCP's rate on the model's path.
SINK_PORT = 9999
_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(4)
while True:
    c, _ = s.accept()
    while c.recv(1 << 20):
        pass
    c.close()
"""


@dataclass
class LinkBench:
    """The links (rate in Mbit/s, each with its added round-trip times in ms) and each case."""

    links: list[tuple[float, list[float]]] = field(
        default_factory=lambda: [(1000.0, [0.0, 20.0]), (10000.0, [0.0])])
    seconds: float = 6.0
    rows: int = 200_000
    compression: bool = True
    #: which servers: the lab's launcher (LocalTritonServer) and/or ``coffea-sonic serve`` started
    #: as a user starts it, each on the lab host
    servers: tuple[str, ...] = ("lab", "serve")


def parse_links(specs: list[str]) -> list[tuple[float, list[float]]]:
    """``RATE_MBIT[/RTT_MS]`` strings, grouped by rate in the order given (one lab per rate)."""
    links: dict[float, list[float]] = {}
    for spec in specs:
        rate, _, rtt = spec.partition("/")
        links.setdefault(float(rate), []).append(float(rtt or 0))
    return list(links.items())


def _tx_bytes(interface: str) -> int:
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


def raw_tcp(address: str, seconds: float) -> float:
    """Bytes per second one socket writes to ``address`` in 1 MiB blocks for ``seconds``."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        block, sent, began = b"\0" * (1 << 20), 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            sock.sendall(block)
            sent += len(block)
        return sent / (time.perf_counter() - began)


#: The wire sampler: a process of its own, so that its readings are never late for want of the
#: caller's interpreter lock (a thread of the caller reads 1 ms late or more while the caller
#: encodes). It records a reading only when the count changed, every ``period`` seconds.
_SAMPLER = """
import json, os, signal, sys, time
fd, period, stop = os.open(sys.argv[1], os.O_RDONLY), float(sys.argv[2]), []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
samples, last = [], -1
while not stop:
    value = int(os.pread(fd, 64, 0))
    if value != last:
        samples.append((time.perf_counter(), value))
        last = value
        if len(samples) == 1:
            print("ready", flush=True)
    time.sleep(period)
samples.append((time.perf_counter(), last))
json.dump(samples, sys.stdout)
"""


class WireSampler:
    """The caller's interface's sent bytes, read every ``period_s`` by a process of its own (a
    context); ``samples``: ``(time.perf_counter(), bytes)`` at every change."""

    def __init__(self, interface: str, period_s: float = 0.0002) -> None:
        self.path = f"/sys/class/net/{interface}/statistics/tx_bytes"
        self.period_s = period_s
        self.samples: list[tuple[float, int]] = []
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> "WireSampler":
        self._process = subprocess.Popen([sys.executable, "-c", _SAMPLER, self.path,
                                          str(self.period_s)], stdout=subprocess.PIPE, text=True)
        self._process.stdout.readline()  # "ready": its first reading is taken
        return self

    def __exit__(self, *_) -> None:
        self._process.terminate()
        out, _ = self._process.communicate(timeout=60)
        self.samples = [(float(t), int(b)) for t, b in json.loads(out)]


def call_phases(calls: list[tuple[float, float]], samples: list[tuple[float, int]]) -> dict:
    """Median per back-to-back call (ms): ``head`` from the call to its first 20 kB on the wire
    (the client's own setup), ``sending`` to 98 % of its bytes, ``tail`` from there to the call's
    return (the round trip, the server's last piece and its answer, the client's assembly).
    ``samples`` are readings of the wire's byte count at its changes (or more often); a call's
    bytes count from the last reading at or before its start. The first and last call are left
    out (the sampler starts and stops around them)."""
    times = np.array([t for t, _ in samples])
    sent = np.array([b for _, b in samples])
    heads, sends, tails = [], [], []
    for start, end in calls[1:-1]:
        before, by_end = (int(np.searchsorted(times, when, "right")) - 1 for when in (start, end))
        if before < 0 or by_end <= before or sent[by_end] - sent[before] <= 20_000:
            continue
        t, b = times[before + 1:by_end + 1], sent[before + 1:by_end + 1] - sent[before]
        first, last = t[np.argmax(b > 20_000)], t[np.argmax(b >= 0.98 * b[-1])]
        heads.append(first - start)
        sends.append(last - first)
        tails.append(end - last)
    if not heads:
        return {}
    return {f"{name}_ms": round(1e3 * float(np.median(values)), 3)
            for name, values in (("head", heads), ("sending", sends), ("tail", tails))}


@contextlib.contextmanager
def _compression(name: str) -> Iterator[None]:
    """``COFFEA_SONIC_COMPRESSION`` set to ``name`` for a fresh client, restored afterwards."""
    before = os.environ.get("COFFEA_SONIC_COMPRESSION")
    os.environ["COFFEA_SONIC_COMPRESSION"] = name
    fresh_clients()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COFFEA_SONIC_COMPRESSION", None)
        else:
            os.environ["COFFEA_SONIC_COMPRESSION"] = before
        fresh_clients()


def _call_for(model, inputs: dict, seconds: float, pipelined: bool) -> list[tuple[float, float]]:
    """Call ``model`` for ``seconds``: back to back, or with the next call sent before the
    previous answer is awaited; the (start, end) of every call."""
    spans: list[tuple[float, float]] = []
    began, pending = time.perf_counter(), None
    while time.perf_counter() - began < seconds:
        started = time.perf_counter()
        if pipelined:
            handle = model.infer_async(inputs)
            if pending is not None:
                pending.result()
            pending = handle
        else:
            model(inputs)
        spans.append((started, time.perf_counter()))
    if pending is not None:
        pending.result()
    return spans


def model_rate(address: str, seconds: float, interface: str, compression: str,
               pipelined: bool, rows: int) -> dict:
    """A default TritonModel on ``address`` for ``seconds``: payload and wire bytes per second."""
    from ..model import TritonModel

    with _compression(compression):
        model = TritonModel(f"triton+grpc://{address}/{PASSTHROUGH}")
        inputs = passthrough_inputs(rows)
        model(inputs)
        # counted inside the sampler's context: its start and end are not the model's time
        with WireSampler(interface) as wire:
            began, wire0 = time.perf_counter(), _tx_bytes(interface)
            spans = _call_for(model, inputs, seconds, pipelined)
            elapsed, sent = time.perf_counter() - began, _tx_bytes(interface) - wire0
        result = {"rows": rows, "payload_Bps": len(spans) * inputs["x"].nbytes / elapsed,
                  "wire_Bps": sent / elapsed, "calls_done": len(spans),
                  "transport": model.transport_kind}
        model.close()
    return {**result, **(call_phases(spans, wire.samples) if not pipelined else {})}


def compressibility(seconds: float = 1.0) -> dict:
    """Per model (passthrough and the zoo): compressed fraction and one core's zlib-6 rate."""
    from .. import zoo

    rows = {}
    for name in [PASSTHROUGH, *zoo.names()]:
        inputs = passthrough_inputs(50_000) if name == PASSTHROUGH else zoo.example_inputs(
            name, 20_000 if name != "emtrk_cnn" else 1000)
        raw = b"".join(np.ascontiguousarray(a).tobytes() for a in inputs.values())
        packed, began, rounds = b"", time.perf_counter(), 0
        while time.perf_counter() - began < seconds or rounds == 0:
            packed = zlib.compress(raw, 6)
            rounds += 1
        rate = rounds * len(raw) / (time.perf_counter() - began)
        rows[name] = {"bytes": len(raw), "compressed_fraction": len(packed) / len(raw),
                      "compress_MBps_one_core": rate / 1e6}
    return rows


def _variants(config: LinkBench) -> list[tuple[str, bool, int]]:
    """(compression, pipelined, rows) of every case on one path: back to back at a quarter, one
    and two times ``rows`` (3.2, 12.8, 25.6 MB by default), two calls in flight."""
    variants = [("none", False, config.rows // 4), ("none", False, config.rows),
                ("none", True, config.rows), ("none", False, 2 * config.rows)]
    if config.compression:
        variants += [("gzip", False, config.rows), ("deflate", False, config.rows)]
    return variants


def _path_cases(config: LinkBench, host, interface: str, rate: float, rtt: float, *,
                relay_port: int, server: str) -> list[dict]:
    """Every case through one path: direct (``rtt`` 0) or through relays adding ``rtt`` ms
    (the model's on ``relay_port``, the sink's on the next port)."""
    from ..netlab import start_relay
    from ..netlab.services import GRPC_PORT

    grpc, sink = host.address(GRPC_PORT), host.address(SINK_PORT)
    if rtt:
        grpc = start_relay(host, target=grpc, listen_port=relay_port, rtt_ms=rtt)
        sink = start_relay(host, target=sink, listen_port=relay_port + 1, rtt_ms=rtt)
    raw = raw_tcp(sink, config.seconds)
    cases = []
    for compression, pipelined, rows in _variants(config):
        case = {"rate_mbit": rate, "rtt_ms": rtt, "compression": compression, "server": server,
                "mode": "2 calls in flight (infer_async)" if pipelined else "back to back",
                "raw_tcp_Bps": raw,
                **model_rate(grpc, config.seconds, interface, compression, pipelined, rows)}
        case["link_busy"] = case["wire_Bps"] * 8 / (rate * 1e6)
        case["raw_busy"] = raw * 8 / (rate * 1e6)
        print(json.dumps(case), flush=True)
        cases.append(case)
    return cases


def _start_server(host, server: str, repository: Path):
    """The model's server on ``host``: the lab's launcher, or ``coffea-sonic serve`` as a user
    types it (its gRPC port 8001, HTTP 8000, metrics 8002)."""
    from ..netlab.services import GRPC_PORT, start_triton

    if server == "lab":
        return start_triton(host, [], repository=repository)
    serve = host.popen([sys.executable, "-m", "coffea_sonic.cli", "serve", "--repository",
                        str(repository), "--host", host.ip, "--grpc-port", str(GRPC_PORT),
                        "--http-port", "8000", "--metrics-port", "8002"], name="serve",
                       grace_s=30.0)
    serve.wait_for_port(GRPC_PORT, timeout_s=180.0)
    return serve


def _link_cases(config: LinkBench, rate: float, rtts: list[float], repository: Path) -> list[dict]:
    """One lab per server: ``srv`` behind a ``rate`` Mbit/s link, the server and the sink on it,
    each path."""
    from ..netlab import Lab, Link

    cases = []
    for server in config.servers:
        with Lab() as lab:
            host = lab.host("srv", Link(rate_mbit=rate))
            sink = host.popen([sys.executable, "-c", _SINK, host.ip, str(SINK_PORT)], name="sink")
            _start_server(host, server, repository)
            sink.wait_for_port(SINK_PORT)
            interface = f"csnl{lab.index}r"  # the caller's end of its veth to the lab's switch
            for index, rtt in enumerate(rtts):
                cases += _path_cases(config, host, interface, rate, rtt,
                                     relay_port=9001 + 2 * index, server=server)
    return cases


def run_link(config: LinkBench) -> dict:
    """Every link and path of ``config``; the report (machine, load, command, cases)."""
    with stamped(seconds=config.seconds, cases=[]) as report:
        repository = write_passthrough(Path(tempfile.mkdtemp(prefix="link-bench-")))
        for rate, rtts in config.links:
            report["cases"] += _link_cases(config, rate, rtts, repository)
        report["compressibility"] = compressibility() if config.compression else {}
    return report


def _case_cells(c: dict) -> list:
    phases = (f"{c['head_ms']:.1f} / {c['sending_ms']:.0f} / {c['tail_ms']:.1f}"
              if "head_ms" in c else "-")
    server = {"lab": "lab launcher", "serve": "coffea-sonic serve"}.get(c.get("server", "lab"))
    return [server, f"{c['rate_mbit'] / 1000:g} Gb/s", f"{c['rtt_ms']:g} ms", c["compression"],
            f"{c.get('rows', 200_000) * 64 / 1e6:.1f}", c["mode"], f"{c['raw_busy']:.0%}",
            f"{c['link_busy']:.0%}", f"{c['payload_Bps'] * 8 / 1e6:.0f}", phases]


def markdown(report: dict) -> str:
    """The cases and the compressibility table, with machine, load and command."""
    lines = [f"# passthrough across a tbf-shaped link ({machine_title(report['machine'])})", "",
             *load_lines(report),
             *table(["server", "link", "added RTT", "compression", "call MB", "calls",
                     "raw TCP busy", "model: link busy", "payload Mbit/s",
                     "per call: head / sending / tail ms"], map(_case_cells, report["cases"])),
             "", *table(["model", "compressed size (zlib 6)", "compress rate, one core (MB/s)"],
                        ([name, f"{row['compressed_fraction']:.0%}",
                          f"{row['compress_MBps_one_core']:.0f}"]
                         for name, row in report.get("compressibility", {}).items()))]
    return "\n".join(lines) + "\n"


def write_link(report: dict, out: str | Path) -> str:
    """link.json and link.md in ``out``; returns the table."""
    return write_report(report, out, "link", markdown)
