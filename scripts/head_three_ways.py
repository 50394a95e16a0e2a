"""The head of a 12.8 MB call measured three ways over the same calls (needs root and tcpdump).

`coffea-sonic bench link` reports a call's head: from the call to its first 20 kB on the
caller's interface. Three clocks on the same back-to-back calls through the lab's 1 Gb/s link:
a thread of the caller reading the interface's tx_bytes every 0.5 ms (the bench's sampler
before: it reads only when it gets the interpreter lock), a process of its own reading it every
0.2 ms (`coffea_sonic.bench.link.WireSampler`), and tcpdump's kernel time stamps of the packets
to the server (their TCP payload summed). Prints the median head of each.

    sudo .venv/bin/python scripts/head_three_ways.py [SECONDS] [lab|serve]
"""

import subprocess, sys, tempfile, threading, time
from pathlib import Path
import numpy as np
from coffea_sonic.bench import link as L
from coffea_sonic.bench.passthrough import PASSTHROUGH, passthrough_inputs, write_passthrough
from coffea_sonic.netlab import Lab, Link


class ThreadSampler:
    """The bench's sampler before: a thread of the caller reading every 0.5 ms."""

    def __init__(self, interface):
        self.path = f"/sys/class/net/{interface}/statistics/tx_bytes"
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.0005):
            with open(self.path) as c:
                self.samples.append((time.perf_counter(), int(c.read())))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._thread.join()


def pcap_heads(spans, packets):
    """Per call but the first and last: seconds from its start to 20 kB of payload sent."""
    t = np.array([p[0] for p in packets])
    n = np.cumsum([p[1] for p in packets])
    heads = []
    for start, end in spans[1:-1]:
        i0 = np.searchsorted(t, start)
        base = n[i0 - 1] if i0 else 0
        j = i0 + np.argmax(n[i0:] - base > 20_000)
        heads.append(t[j] - start)
    return heads


def main(seconds=5.0, rows=200_000, server="lab"):
    from coffea_sonic.model import TritonModel
    from coffea_sonic.netlab.services import GRPC_PORT

    repo = write_passthrough(Path(tempfile.mkdtemp()))
    with Lab() as lab:
        host = lab.host("srv", Link(rate_mbit=1000.0))
        L._start_server(host, server, repo)
        iface = f"csnl{lab.index}r"
        model = TritonModel(f"triton+grpc://{host.address(GRPC_PORT)}/{PASSTHROUGH}")
        inputs = passthrough_inputs(rows)
        for _ in range(3):
            model(inputs)
        capture = str(Path(tempfile.mkdtemp()) / "calls.pcap")
        cap = subprocess.Popen(
            [
                "tcpdump",
                "-i",
                iface,
                "-n",
                "-s",
                "96",
                "-B",
                "65536",
                "--time-stamp-precision=micro",
                "-w",
                capture,
                "tcp",
                "and",
                "dst",
                "port",
                str(GRPC_PORT),
            ],
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)
        offset0 = time.time() - time.perf_counter()
        with ThreadSampler(iface) as old, L.WireSampler(iface) as new:
            spans = L._call_for(model, inputs, seconds, False)
        offset1 = time.time() - time.perf_counter()
        time.sleep(0.5)
        cap.terminate()
        cap.wait()
        out = subprocess.run(
            ["tcpdump", "-r", capture, "-n", "-tt", "-q"], capture_output=True, text=True
        ).stdout
        packets = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) > 2 and parts[-2] == "tcp":
                packets.append((float(parts[0]) - offset0, int(parts[-1])))
        model.close()
    med = lambda v: round(1e3 * float(np.median(v)), 3)
    print(
        f"clock offset drift {1e6 * (offset1 - offset0):.1f} us; calls {len(spans)}; packets {len(packets)}"
    )
    print(
        "head ms, median: thread sampler",
        L.call_phases(spans, old.samples).get("head_ms"),
        "| process sampler",
        L.call_phases(spans, new.samples).get("head_ms"),
        "| tcpdump",
        med(pcap_heads(spans, packets)),
    )


if __name__ == "__main__":
    main(
        float(sys.argv[1]) if len(sys.argv) > 1 else 5.0,
        server=sys.argv[2] if len(sys.argv) > 2 else "lab",
    )
