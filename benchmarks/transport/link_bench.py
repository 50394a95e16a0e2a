"""A single default TritonModel across a shaped link: goodput vs raw TCP, with and without compression.

Needs root (:mod:`coffea_sonic.netlab`, the hosts-in-namespaces harness). One lab host ``srv``
behind a tbf-shaped link serves the transport-bound ``passthrough`` model (x: 16 floats -> y: 2);
this process calls it back to back with 200 000-row calls (12.8 MB), directly or through the
lab's relay adding a round-trip time. Per case: raw TCP's rate on the same path (one socket,
1 MiB writes), the model's request bytes per second, and the link busy fraction (bytes on the
caller's interface / link rate); with ``compression`` gzip and deflate too. Then, per zoo model,
how much its example inputs compress and how fast (one core, zlib level 6 as gRPC's gzip): the
rate a compressing client could feed at most.

    python benchmarks/transport/link_bench.py --out benchmarks/results/cpu2-link
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from coffea_sonic import zoo
from coffea_sonic.bench.machine import machine_info
from coffea_sonic.bench.reference_run import uptime_line
from coffea_sonic.bench.passthrough import PASSTHROUGH, passthrough_inputs
from coffea_sonic.netlab import Lab, Link, start_relay
from coffea_sonic.netlab.processes import port_open

SERVER = """
import signal, sys, tempfile, threading
from pathlib import Path
from coffea_sonic.bench.passthrough import write_passthrough
from coffea_sonic.server import LocalTritonServer
stop = threading.Event()
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda *_: stop.set())
with LocalTritonServer(repository=write_passthrough(Path(tempfile.mkdtemp())), device="cpu",
                       host=sys.argv[1], grpc_port=8001, http_port=8000, metrics_port=8002):
    stop.wait()
"""
SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 9999)); s.listen(4)
while True:
    c, _ = s.accept()
    while c.recv(1 << 20):
        pass
    c.close()
"""


def tx_bytes(interface: str) -> int:
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


def raw_tcp(address: str, seconds: float) -> float:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        block, sent, began = b"\0" * (1 << 20), 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            sock.sendall(block)
            sent += len(block)
        return sent / (time.perf_counter() - began)


class WireSampler:
    """The caller's interface's sent bytes every half millisecond, in a thread (a context)."""

    def __init__(self, interface: str) -> None:
        self.path = f"/sys/class/net/{interface}/statistics/tx_bytes"
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with open(self.path) as counter:
                self.samples.append((time.perf_counter(), int(counter.read())))
            time.sleep(0.0005)

    def __enter__(self) -> "WireSampler":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()


def call_phases(calls: list[tuple[float, float]], samples: list[tuple[float, int]]) -> dict:
    """Median per back-to-back call (ms): ``head`` from the call to its first 20 kB on the wire
    (the client's own setup), ``sending`` to 98 % of its bytes, ``tail`` from there to the call's
    return (the round trip, the server's last piece and its answer, the client's assembly)."""
    times = np.array([t for t, _ in samples])
    sent = np.array([b for _, b in samples])
    heads, sends, tails = [], [], []
    for start, end in calls[1:-1]:
        inside = (times >= start) & (times <= end)
        if inside.sum() < 4:
            continue
        t, b = times[inside], sent[inside] - sent[inside][0]
        first, last = t[np.argmax(b > 20_000)], t[np.argmax(b >= 0.98 * b[-1])]
        heads.append(first - start)
        sends.append(last - first)
        tails.append(end - last)
    if not heads:
        return {}
    return {f"{name}_ms": 1e3 * float(np.median(values))
            for name, values in (("head", heads), ("sending", sends), ("tail", tails))}


def model_rate(address: str, seconds: float, interface: str, compression: str,
               pipelined: bool, rows: int = 200_000) -> dict:
    from coffea_sonic.model import TritonModel
    from coffea_sonic.routing import clear_routers
    from coffea_sonic.transport.registry import close_all_transports

    import os
    os.environ["COFFEA_SONIC_COMPRESSION"] = compression
    clear_routers()
    close_all_transports()
    model = TritonModel(f"triton+grpc://{address}/{PASSTHROUGH}")
    inputs = passthrough_inputs(rows)
    model(inputs)
    spans: list[tuple[float, float]] = []
    began, wire0 = time.perf_counter(), tx_bytes(interface)
    pending = None
    with WireSampler(interface) as wire:
        while time.perf_counter() - began < seconds:
            started = time.perf_counter()
            if pipelined:  # the next call sent before the previous one's answer is awaited
                handle = model.infer_async(inputs)
                if pending is not None:
                    pending.result()
                pending = handle
            else:
                model(inputs)
            spans.append((started, time.perf_counter()))
        if pending is not None:
            pending.result()
        elapsed = time.perf_counter() - began
    return {"rows": rows, "payload_Bps": len(spans) * inputs["x"].nbytes / elapsed,
            "wire_Bps": (tx_bytes(interface) - wire0) / elapsed, "calls_done": len(spans),
            "transport": model.transport_kind,
            **(call_phases(spans, wire.samples) if not pipelined else {})}


def compressibility(seconds: float = 1.0) -> dict:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", default="bench-output/link")
    parser.add_argument("--no-compression", action="store_true",
                        help="leave out the gzip/deflate cases and the compressibility table")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(), "uptime_before": uptime_line(), "command": " ".join(sys.argv),
              "cases": []}
    folder = Path(tempfile.mkdtemp(prefix="link-bench-"))
    (folder / "server.py").write_text(SERVER)
    (folder / "sink.py").write_text(SINK)
    for rate, rtts in ((1000, (0, 20)), (10000, (0,))):
        with Lab() as lab:
            host = lab.host("srv", Link(rate_mbit=rate))
            interface = f"csnl{lab.index}r"
            host.popen([sys.executable, str(folder / "server.py"), host.ip], name="triton",
                       grace_s=20)
            host.popen([sys.executable, str(folder / "sink.py"), host.ip], name="sink")
            lab.wait_until(lambda: port_open(host.address(8001)), timeout_s=180, what="triton")
            lab.wait_until(lambda: port_open(host.address(9999)), timeout_s=30, what="sink")
            for rtt in rtts:
                grpc, sink = host.address(8001), host.address(9999)
                if rtt:
                    grpc = start_relay(host, target=grpc, listen_port=9001, rtt_ms=rtt)
                    sink = start_relay(host, target=sink, listen_port=9002, rtt_ms=rtt)
                raw = raw_tcp(sink, args.seconds)
                variants = [("none", False, 200_000), ("none", True, 200_000),
                            ("none", False, 400_000)]
                if not args.no_compression:
                    variants += [("gzip", False, 200_000), ("deflate", False, 200_000)]
                for compression, pipelined, rows in variants:
                    case = {"rate_mbit": rate, "rtt_ms": rtt, "compression": compression,
                            "mode": "2 calls in flight (infer_async)" if pipelined else
                            "back to back", "raw_tcp_Bps": raw,
                            **model_rate(grpc, args.seconds, interface, compression, pipelined,
                                         rows)}
                    case["link_busy"] = case["wire_Bps"] * 8 / (rate * 1e6)
                    case["raw_busy"] = raw * 8 / (rate * 1e6)
                    report["cases"].append(case)
                    print(json.dumps(case), flush=True)
    report["compressibility"] = {} if args.no_compression else compressibility()
    report["uptime_after"] = uptime_line()
    (out / "link.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "link.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# passthrough across a tbf-shaped link ({m['cpu_model']}, {m['cpu_cores']} cores, "
             f"{m['date']})", "", f"load: before `{report['uptime_before']}`, after "
             f"`{report.get('uptime_after', '')}`", "", f"command: `{report['command']}`", "",
             "| link | added RTT | compression | call MB | calls | raw TCP busy | model: link busy | "
             "payload Mbit/s | per call: head / sending / tail ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in report["cases"]:
        phases = (f"{c['head_ms']:.1f} / {c['sending_ms']:.0f} / {c['tail_ms']:.1f}"
                  if "head_ms" in c else "-")
        lines.append(f"| {c['rate_mbit'] / 1000:g} Gb/s | {c['rtt_ms']} ms | {c['compression']} | "
                     f"{c.get('rows', 200_000) * 64 / 1e6:.1f} | {c['mode']} | {c['raw_busy']:.0%} | "
                     f"{c['link_busy']:.0%} | {c['payload_Bps'] * 8 / 1e6:.0f} | {phases} |")
    lines += ["", "| model | compressed size (zlib 6) | compress rate, one core (MB/s) |",
              "|---|---|---|"]
    for name, row in report.get("compressibility", {}).items():
        lines.append(f"| {name} | {row['compressed_fraction']:.0%} | "
                     f"{row['compress_MBps_one_core']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
