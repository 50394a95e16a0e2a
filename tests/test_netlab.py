"""The hosts-on-one-machine harness (coffea_sonic.netlab): hosts that share no memory, links with a
rate, a relay that adds a round trip, cut and restored links, and nothing left behind, even when
the test fails or its process is killed. Needs root (CI runs as root on the project's machine)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coffea_sonic.errors import NetworkLabError
from coffea_sonic.netlab import Lab, Link, missing_requirements, port_open, start_relay
from coffea_sonic.netlab.lab import STATE_ROOT
from coffea_sonic.netlab.netlink import BACKEND_ENV, netlink

pytestmark = [pytest.mark.netlab,
              pytest.mark.skipif(bool(missing_requirements()), reason=missing_requirements())]

# A TCP service on a host: echoes one line per connection; "count" mode answers the bytes received.
SINK = textwrap.dedent("""
    import socket, sys
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(sys.argv[1])))
    server.listen()
    while True:
        connection, _ = server.accept()
        received = 0
        while True:
            data = connection.recv(1 << 20)
            if not data or data.endswith(b"\\n"):
                received += len(data)
                break
            received += len(data)
        connection.sendall(str(received).encode())
        connection.close()
""")


def _sink(host, port: int = 5000) -> str:
    sink = host.popen([sys.executable, "-c", SINK, str(port)], name=f"sink-{port}")
    return sink.wait_for_port(port)


def _send(host, address: str, size: int) -> tuple[float, float]:
    """Seconds for one byte and its answer (a round trip), then ``size`` bytes, from ``host``."""
    ip, _, port = address.rpartition(":")
    script = textwrap.dedent(f"""
        import socket, time
        def send(payload):
            start = time.monotonic()
            with socket.create_connection(({ip!r}, {port})) as connection:
                connection.sendall(payload)
                assert int(connection.recv(64)) == len(payload)
            return time.monotonic() - start
        print(send(b"\\n"), send(b"x" * ({size} - 1) + b"\\n"))
    """)
    first, second = host.run([sys.executable, "-c", script]).stdout.split()
    return float(first), float(second)


def _leftovers(index: int) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found = [name for name in listing.split() if name.startswith(f"csnl{index}-")]
    found += [line for line in Path("/proc/mounts").read_text().splitlines() if "netlab-shm" in line
              and f"lab-{index}/" in line]
    if (STATE_ROOT / f"lab-{index}").exists():
        found.append(str(STATE_ROOT / f"lab-{index}"))
    return found


def test_hosts_have_their_own_shared_memory_and_hostname_but_reach_each_other():
    with Lab() as lab:
        a, b = lab.host("a"), lab.host("b")
        a.run(["sh", "-c", "echo a > /dev/shm/netlab-probe"])
        assert b.run(["ls", "/dev/shm"]).stdout.split() == []
        assert not Path("/dev/shm/netlab-probe").exists()
        assert a.run(["cat", "/dev/shm/netlab-probe"]).stdout == "a\n"  # one host, one /dev/shm
        assert a.run(["hostname"]).stdout.strip() == "a"
        address = _sink(b)
        assert port_open(address)  # from the submitting process
        assert _send(a, address, 10)[0] > 0


def test_a_link_is_shaped_to_its_rate_both_ways_and_changed_mid_run():
    with Lab() as lab:
        slow, other = lab.host("slow", Link(rate_mbit=20)), lab.host("other")
        for namespace, device in ((slow.namespace, "eth0"), (lab.switch, slow.port)):
            qdisc = subprocess.run(["tc", "-n", namespace, "qdisc", "show", "dev", device],
                                   capture_output=True, text=True).stdout
            assert "tbf" in qdisc and "rate 20Mbit" in qdisc
        address = _sink(other)
        # 2.5 MB at 20 Mbit/s cannot take less than 1 s (the bucket lets 64 KiB through at once)
        assert _send(slow, address, 2_500_000)[1] > 0.9
        lab.set_link(slow, Link(rate_mbit=None))
        qdisc = subprocess.run(["tc", "-n", slow.namespace, "qdisc", "show", "dev", "eth0"],
                               capture_output=True, text=True).stdout
        assert "tbf" not in qdisc


def test_the_relay_adds_its_round_trip_time_and_passes_the_bytes():
    with Lab() as lab:
        client, server = lab.host("client"), lab.host("server", Link(rate_mbit=1000, rtt_ms=80))
        direct = _sink(server)
        far = start_relay(server, direct, 9001)
        assert far == server.address(9001)
        round_trip, _ = _send(client, far, 10)
        # connect + request + answer: at least one added round trip
        assert round_trip >= 0.08
        assert _send(client, far, 3_000_000)[1] >= 0.08  # the answer counts every byte


def test_a_cut_link_stalls_connections_and_a_restored_one_carries_them_again():
    with Lab() as lab:
        server = lab.host("server")
        address = _sink(server)
        lab.cut(server)
        assert not port_open(address, timeout_s=0.5)
        lab.restore(server)
        lab.wait_until(lambda: port_open(address), timeout_s=30, what="the restored link")


def test_everything_is_removed_when_the_body_raises():
    with pytest.raises(RuntimeError, match="the test failed"):
        with Lab() as lab:
            host = lab.host("a")
            sleeper = host.popen(["sleep", "600"], name="sleeper")
            index = lab.index
            raise RuntimeError("the test failed")
    assert not sleeper.alive
    assert _leftovers(index) == []


def test_a_lab_whose_process_was_killed_is_swept_by_the_next_one():
    script = textwrap.dedent("""
        import sys, time
        from coffea_sonic.netlab import Lab
        lab = Lab().start()
        host = lab.host("orphan")
        host.popen(["sleep", "600"], name="sleeper")
        print(lab.index, flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        index = int(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert _leftovers(index)  # the namespaces outlive a killed owner ...
    with Lab():
        pass  # ... until the next lab starts
    assert _leftovers(index) == []


def test_bad_host_names_and_duplicate_hosts_are_refused():
    with Lab() as lab:
        lab.host("a")
        with pytest.raises(NetworkLabError, match="already has a host 'a'"):
            lab.host("a")
        with pytest.raises(NetworkLabError, match="bad host name"):
            lab.host("a name with spaces")
        with pytest.raises(NetworkLabError, match="no host 'b'"):
            lab.cut("b")


def _qdisc_kinds(namespace: str, device: str) -> set[str]:
    from pyroute2 import NetNS

    with NetNS(namespace) as route:
        index = route.link_lookup(ifname=device)[0]
        return {qdisc.get_attr("TCA_KIND") for qdisc in route.get_qdiscs(index=index)}


@pytest.mark.skipif(importlib.util.find_spec("pyroute2") is None, reason="needs pyroute2")
def test_without_ip_and_tc_a_lab_makes_and_shapes_its_links_through_pyroute2(tmp_path, monkeypatch):
    # what the GPU machines have: util-linux, no iproute2 (and no package index)
    for tool in ("nsenter", "unshare", "mount", "umount", "sh", "hostname", "ls"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert shutil.which("ip") is None and missing_requirements() == ""
    assert netlink().name == "pyroute2"
    with Lab() as lab:
        slow, other = lab.host("slow", Link(rate_mbit=20)), lab.host("other")
        assert _qdisc_kinds(slow.namespace, "eth0") == {"tbf"}
        assert _qdisc_kinds(lab.switch, slow.port) == {"tbf"}
        assert slow.run(["ls", "/dev/shm"]).stdout.split() == []
        address = _sink(other)
        assert _send(slow, address, 2_500_000)[1] > 0.9  # 2.5 MB at 20 Mbit/s: at least 1 s
        lab.set_link(slow, Link(rate_mbit=25_000))  # above tbf's 32-bit rate (rate64)
        assert _qdisc_kinds(slow.namespace, "eth0") == {"tbf"}
        lab.set_link(slow, Link(rate_mbit=None))
        assert "tbf" not in _qdisc_kinds(slow.namespace, "eth0")
        index = lab.index
    monkeypatch.undo()
    assert _leftovers(index) == []
