"""The lab's network operations, through iproute2's ``ip``/``tc`` or through pyroute2 (netlink).

Which one, and why both: docs/internals/netlab.md (with an example).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import signal
import subprocess
from typing import Protocol, Sequence

from ..errors import NetworkLabError

#: Environment variable naming the backend (``ip`` or ``pyroute2``): a knob of the test and bench
#: harness, not a setting of the package.
BACKEND_ENV = "NETLAB_NETLINK"
#: A device's root qdisc, as netlink names it (TC_H_ROOT).
TC_ROOT = 0xFFFFFFFF


def run_command(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ``ip``/``tc``/``mount`` command; a failure raises :class:`NetworkLabError` with its
    stderr."""
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NetworkLabError(f"{' '.join(argv)} failed ({result.returncode}): "
                              f"{result.stderr.strip() or result.stdout.strip()}")
    return result


class Netlink(Protocol):
    """What a lab asks of the kernel's network configuration. ``ns`` None: this process' own."""

    name: str

    def netns_path(self, ns: str) -> str: ...
    def netns_list(self) -> list[str]: ...
    def netns_add(self, ns: str) -> None: ...
    def netns_delete(self, ns: str) -> None: ...
    def netns_kill(self, ns: str) -> None: ...
    def add_bridge(self, ns: str, name: str) -> None: ...
    def add_veth(self, ns: str | None, name: str, peer: str, peer_ns: str) -> None: ...
    def add_address(self, ns: str | None, device: str, cidr: str) -> None: ...
    def set_up(self, ns: str | None, device: str, up: bool = True, master: str = "") -> None: ...
    def delete_link(self, ns: str | None, device: str) -> None: ...
    def set_tbf(self, ns: str, device: str, rate_mbit: float, burst: int,
                latency_ms: float) -> None: ...
    def clear_qdisc(self, ns: str, device: str) -> None: ...


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class IpTools:
    """The backend of iproute2's ``ip`` and ``tc`` commands."""

    name = "ip"

    @staticmethod
    def _run(argv: list[str], check: bool = True):
        return run_command(argv, check=check)

    @staticmethod
    def _in(ns: str | None) -> list[str]:
        return ["ip", "-n", ns] if ns else ["ip"]

    def netns_path(self, ns: str) -> str:
        return f"/run/netns/{ns}"

    def netns_list(self) -> list[str]:
        listing = self._run(["ip", "netns", "list"], check=False).stdout
        return [line.split()[0] for line in listing.splitlines() if line.strip()]

    def netns_add(self, ns: str) -> None:
        self._run(["ip", "netns", "add", ns])
        self.set_up(ns, "lo")

    def netns_delete(self, ns: str) -> None:
        self._run(["ip", "netns", "delete", ns], check=False)

    def netns_kill(self, ns: str) -> None:
        pids = self._run(["ip", "netns", "pids", ns], check=False).stdout.split()
        _kill([int(pid) for pid in pids if pid.isdigit()])

    def add_bridge(self, ns: str, name: str) -> None:
        self._run([*self._in(ns), "link", "add", name, "type", "bridge"])
        self.set_up(ns, name)

    def add_veth(self, ns: str | None, name: str, peer: str, peer_ns: str) -> None:
        self._run([*self._in(ns), "link", "add", name, "type", "veth", "peer", "name", peer,
                   "netns", peer_ns])

    def add_address(self, ns: str | None, device: str, cidr: str) -> None:
        self._run([*self._in(ns), "addr", "add", cidr, "dev", device])

    def set_up(self, ns: str | None, device: str, up: bool = True, master: str = "") -> None:
        self._run([*self._in(ns), "link", "set", device, *(["master", master] if master else []),
                   "up" if up else "down"])

    def delete_link(self, ns: str | None, device: str) -> None:
        self._run([*self._in(ns), "link", "delete", device], check=False)

    def set_tbf(self, ns: str, device: str, rate_mbit: float, burst: int,
                latency_ms: float) -> None:
        self._run(["tc", "-n", ns, "qdisc", "replace", "dev", device, "root", "tbf", "rate",
                   f"{rate_mbit:g}mbit", "burst", str(burst), "latency", f"{latency_ms:g}ms"])

    def clear_qdisc(self, ns: str, device: str) -> None:
        self._run(["tc", "-n", ns, "qdisc", "del", "dev", device, "root"], check=False)


class Pyroute2Netlink:
    """The backend of pyroute2 (netlink from Python; no ``ip``/``tc`` needed)."""

    name = "pyroute2"

    def __init__(self) -> None:
        from pyroute2 import netns
        self._netns = netns

    def netns_path(self, ns: str) -> str:
        return f"{self._netns.NETNS_RUN_DIR}/{ns}"

    def _route(self, ns: str | None):
        from pyroute2 import IPRoute, NetNS
        return NetNS(ns) if ns else IPRoute()

    def _call(self, ns: str | None, what: str, action) -> None:
        try:
            with self._route(ns) as route:
                action(route)
        except Exception as error:  # pyroute2 raises NetlinkError, OSError, KeyError...
            where = f" in namespace {ns}" if ns else ""
            raise NetworkLabError(f"netlink: {what}{where} failed: {error}") from error

    @staticmethod
    def _index(route, device: str) -> int:
        found = route.link_lookup(ifname=device)
        if not found:
            raise NetworkLabError(f"netlink: no device {device!r}")
        return found[0]

    def netns_list(self) -> list[str]:
        return list(self._netns.listnetns())

    def netns_add(self, ns: str) -> None:
        try:
            self._netns.create(ns)
        except Exception as error:
            raise NetworkLabError(f"netlink: creating namespace {ns} failed: {error}") from error
        self.set_up(ns, "lo")

    def netns_delete(self, ns: str) -> None:
        try:
            self._netns.remove(ns)
        except OSError:
            pass

    def netns_kill(self, ns: str) -> None:
        _kill([int(pid) for pid in self._netns.ns_pids().get(ns, [])])

    def add_bridge(self, ns: str, name: str) -> None:
        self._call(ns, f"adding bridge {name}", lambda r: r.link("add", ifname=name, kind="bridge"))
        self.set_up(ns, name)

    def add_veth(self, ns: str | None, name: str, peer: str, peer_ns: str) -> None:
        self._call(ns, f"adding veth {name}", lambda r: r.link(
            "add", ifname=name, kind="veth", peer={"ifname": peer, "net_ns_fd": peer_ns}))

    def add_address(self, ns: str | None, device: str, cidr: str) -> None:
        address, prefix = cidr.split("/")
        self._call(ns, f"adding {cidr} to {device}", lambda r: r.addr(
            "add", index=self._index(r, device), address=address, prefixlen=int(prefix)))

    def set_up(self, ns: str | None, device: str, up: bool = True, master: str = "") -> None:
        def action(route) -> None:
            index = self._index(route, device)
            if master:
                route.link("set", index=index, master=self._index(route, master))
            route.link("set", index=index, state="up" if up else "down")
        self._call(ns, f"setting {device} {'up' if up else 'down'}", action)

    def delete_link(self, ns: str | None, device: str) -> None:
        try:
            with self._route(ns) as route:
                found = route.link_lookup(ifname=device)
                if found:
                    route.link("del", index=found[0])
        except Exception:  # noqa: BLE001 - gone already (its namespace was deleted)
            pass

    def set_tbf(self, ns: str, device: str, rate_mbit: float, burst: int,
                latency_ms: float) -> None:
        self._call(ns, f"shaping {device} to {rate_mbit:g} Mbit/s", lambda r: r.tc(
            "replace", "tbf", self._index(r, device), rate=f"{rate_mbit:g}mbit", burst=burst,
            latency=f"{latency_ms:g}ms"))

    def clear_qdisc(self, ns: str, device: str) -> None:
        from pyroute2 import NetlinkError

        def action(route) -> None:
            try:
                route.tc("del", index=self._index(route, device), parent=TC_ROOT)
            except NetlinkError as error:
                if error.code not in (errno.ENOENT, errno.EINVAL):  # no root qdisc: nothing to do
                    raise
        self._call(ns, f"removing {device}'s shaping", action)


BACKENDS = {"ip": IpTools, "pyroute2": Pyroute2Netlink}


def available_backend() -> str:
    """The backend a lab uses here ("" when none can): ``$NETLAB_NETLINK``, else
    ``ip`` where ``ip`` and ``tc`` are on PATH, else ``pyroute2`` where it imports.

    >>> available_backend() in ("", "ip", "pyroute2")
    True
    """
    chosen = os.environ.get(BACKEND_ENV, "")
    if chosen:
        if chosen not in BACKENDS:
            raise NetworkLabError(f"{BACKEND_ENV}={chosen!r}: expected one of {sorted(BACKENDS)}")
        return chosen
    if shutil.which("ip") and shutil.which("tc"):
        return "ip"
    if importlib.util.find_spec("pyroute2") is not None:
        return "pyroute2"
    return ""


def netlink() -> Netlink:
    """The backend :func:`available_backend` names; raises NetworkLabError when there is none."""
    name = available_backend()
    if not name:
        raise NetworkLabError("a lab of hosts needs iproute2 (ip and tc on PATH) or the pyroute2 "
                              "package (pip install pyroute2; pure Python, a wheel can be carried)")
    return BACKENDS[name]()
