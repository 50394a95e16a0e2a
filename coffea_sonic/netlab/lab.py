"""A lab of named hosts on one machine: network namespaces with private ``/dev/shm``, on one switch.

How it works, what it needs, and examples: docs/internals/netlab.md.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import time
import weakref
from pathlib import Path
from typing import Sequence

from ..errors import NetworkLabError
from .links import Link, shape
from .netlink import available_backend, netlink, run_command
from .processes import HostProcess

logger = logging.getLogger(__name__)

#: Where labs keep their state (one folder per lab: owner PID, the hosts' mount-namespace files).
STATE_ROOT = Path("/run/coffea-sonic-netlab")
#: Labs on one machine at once (each gets its own /24 and names).
MAX_LABS = 200
#: The hosts' /dev/shm size (a tmpfs: pages are used only when written).
SHM_SIZE = "4g"
#: Address of the calling process on the lab's switch; hosts get .10, .11, ...
CALLER_OCTET = 1
FIRST_HOST_OCTET = 10


def missing_requirements() -> str:
    """Why a lab cannot be made here ("" when it can): root and the tools it runs.

    >>> isinstance(missing_requirements(), str)
    True
    """
    if os.geteuid() != 0:
        return "a lab of hosts needs root (network and mount namespaces)"
    missing = [tool for tool in ("nsenter", "unshare", "mount", "umount")
               if shutil.which(tool) is None]
    if missing:
        return f"a lab of hosts needs {', '.join(missing)} on PATH (util-linux)"
    if not available_backend():
        return "a lab of hosts needs iproute2 (ip and tc on PATH) or the pyroute2 package"
    return ""


def _require_tools() -> None:
    why = missing_requirements()
    if why:
        raise NetworkLabError(why)


def _namespaces(prefix: str) -> list[str]:
    return [name for name in netlink().netns_list() if name.startswith(prefix)]


def _teardown(index: int, state: Path) -> None:
    """Remove everything of lab ``index``, by its names (a dead owner's lab goes the same way)."""
    prefix, net = f"csnl{index}-", netlink()
    for namespace in _namespaces(prefix):
        net.netns_kill(namespace)
    for mount_file in sorted([*state.glob("*.mnt"), *state.glob("*.uts")]):
        run_command(["umount", "--lazy", str(mount_file)], check=False)
        mount_file.unlink(missing_ok=True)
    for namespace in _namespaces(prefix):
        net.netns_delete(namespace)
    net.delete_link(None, f"csnl{index}r")
    shutil.rmtree(state, ignore_errors=True)


def sweep_stale_labs() -> list[int]:
    """Tear down labs whose owning process is gone; return their indices."""
    swept = []
    for state in sorted(STATE_ROOT.glob("lab-*")):
        try:
            owner = int((state / "owner").read_text())
        except (OSError, ValueError):
            owner = -1
        if owner > 0 and Path(f"/proc/{owner}").exists():
            continue
        index = int(state.name.split("-")[1])
        _teardown(index, state)
        swept.append(index)
    if swept:
        logger.info("netlab: swept labs %s left by processes that are gone", swept)
    return swept


class Host:
    """One host of a :class:`Lab`: its namespace, address and link; processes run inside it."""

    def __init__(self, lab: "Lab", name: str, number: int, link: Link) -> None:
        self.lab = lab
        self.name = name
        self.number = number
        self.link = link
        self.namespace = f"csnl{lab.index}-{name}"
        self.ip = f"{lab.subnet}.{FIRST_HOST_OCTET + number}"
        self.mount_file = lab.state / f"{name}.mnt"
        self.uts_file = lab.state / f"{name}.uts"
        #: the switch-side end of the host's link (in the lab's switch namespace)
        self.port = f"p{number}"

    def __repr__(self) -> str:
        return f"Host({self.name!r}, ip={self.ip}, {self.link})"

    def address(self, port: int) -> str:
        """``ip:port`` of a service listening on this host."""
        return f"{self.ip}:{port}"

    def command_prefix(self) -> list[str]:
        """Prefix that runs a command inside this host (its network and mount namespaces)."""
        return ["nsenter", f"--net={netlink().netns_path(self.namespace)}",
                f"--mount={self.mount_file}",
                f"--uts={self.uts_file}", "--"]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run a short command inside the host and wait for it."""
        result = subprocess.run(self.command_prefix() + list(argv), capture_output=True, text=True,
                                timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise NetworkLabError(f"on {self.name}: {' '.join(argv)} failed ({result.returncode}): "
                                  f"{result.stderr.strip()[-2000:]}")
        return result

    def popen(self, argv: Sequence[str], *, name: str, env: dict | None = None,
              grace_s: float = 10.0) -> HostProcess:
        """Start a long-running process inside the host; the lab stops it on exit.

        Its output goes to ``<lab folder>/<host>-<name>.log`` (``HostProcess.log_tail()``).
        """
        process = HostProcess(self, argv, name=name, env=env, grace_s=grace_s,
                              log_path=self.lab.logs / f"{self.name}-{name}.log")
        self.lab._processes.append(process)
        return process


class Lab:
    """Hosts on one machine (docs/internals/netlab.md). Use as a context manager.

    ``subnet``: the first two octets of the lab's addresses (each lab takes a /24 of it).
    """

    def __init__(self, *, subnet: str = "10.231", logs: str | os.PathLike | None = None) -> None:
        self.subnet_base = subnet
        self.index = -1
        self.subnet = ""
        self.state = STATE_ROOT
        self.hosts: dict[str, Host] = {}
        self._processes: list[HostProcess] = []
        self._logs_given = logs is not None
        self.logs = Path(logs) if logs is not None else Path()
        self._finalizer: weakref.finalize | None = None

    def __repr__(self) -> str:
        return f"Lab(index={self.index}, hosts={list(self.hosts)})"

    @property
    def switch(self) -> str:
        return f"csnl{self.index}-switch"

    @property
    def caller_ip(self) -> str:
        """The calling process' address on the lab's switch."""
        return f"{self.subnet}.{CALLER_OCTET}"

    # -- lifecycle --------------------------------------------------------------------------------

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> "Lab":
        """Take a free lab index, make the switch and join the caller to it."""
        _require_tools()
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        sweep_stale_labs()
        self._claim_index()
        self._finalizer = weakref.finalize(self, _teardown, self.index, self.state)
        atexit.register(self._finalizer)
        try:
            self._make_switch()
        except BaseException:
            self.stop()
            raise
        return self

    def _claim_index(self) -> None:
        for index in range(MAX_LABS):
            state = STATE_ROOT / f"lab-{index}"
            try:
                state.mkdir()
            except FileExistsError:
                continue
            (state / "owner").write_text(str(os.getpid()))
            self.index, self.state = index, state
            self.subnet = f"{self.subnet_base}.{index}"
            if not self._logs_given:
                self.logs = state / "logs"
            self.logs.mkdir(parents=True, exist_ok=True)
            return
        raise NetworkLabError(f"all {MAX_LABS} lab slots under {STATE_ROOT} are taken")

    def _make_switch(self) -> None:
        switch, net = self.switch, netlink()
        net.netns_add(switch)
        net.add_bridge(switch, "br0")
        caller = f"csnl{self.index}r"
        net.add_veth(None, caller, "caller", switch)
        net.set_up(switch, "caller", master="br0")
        net.add_address(None, caller, f"{self.caller_ip}/24")
        net.set_up(None, caller)

    def stop(self) -> None:
        """Stop every process, then remove hosts, switch and mounts. Idempotent."""
        for process in self._processes:  # all at once: each takes its own time to exit
            process.terminate()
        for process in reversed(self._processes):
            try:
                process.stop()
            except Exception as error:  # noqa: BLE001 - the namespaces must go regardless
                logger.warning("netlab: stopping %s failed: %s", process, error)
        self._processes.clear()
        if self._finalizer is not None:
            self._finalizer()
            atexit.unregister(self._finalizer)
            self._finalizer = None
        self.hosts.clear()

    # -- hosts and links --------------------------------------------------------------------------

    def host(self, name: str, link: Link = Link()) -> Host:
        """Make a host named ``name`` (letters, digits, ``-``; at most 12 characters)."""
        if name in self.hosts:
            raise NetworkLabError(f"the lab already has a host {name!r}")
        if not (0 < len(name) <= 12 and name.replace("-", "").isalnum()) or name == "switch":
            raise NetworkLabError(f"bad host name {name!r}: 1-12 letters, digits or '-'")
        host = Host(self, name, len(self.hosts), link)
        self._make_namespace(host)
        self._make_private_shm(host)
        self.hosts[name] = host
        self.set_link(host, link)
        return host

    def _make_namespace(self, host: Host) -> None:
        namespace, switch, net = host.namespace, self.switch, netlink()
        net.netns_add(namespace)
        net.add_veth(namespace, "eth0", host.port, switch)
        net.add_address(namespace, "eth0", f"{host.ip}/24")
        net.set_up(namespace, "eth0")
        net.set_up(switch, host.port, master="br0")

    def _make_private_shm(self, host: Host) -> None:
        """The host's mount namespace (a fresh tmpfs on /dev/shm) and hostname, kept by files."""
        host.mount_file.touch()
        host.uts_file.touch()
        make = ["unshare", f"--mount={host.mount_file}", f"--uts={host.uts_file}", "--propagation",
                "private", "sh", "-c", f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 netlab-shm "
                f"/dev/shm && hostname {host.name}"]
        result = run_command(make, check=False)
        if result.returncode != 0 and "shared" in result.stderr:
            # the folder holding the namespace file must not be a shared mount (systemd hosts)
            run_command(["mount", "--bind", str(self.state), str(self.state)])
            run_command(["mount", "--make-private", str(self.state)])
            result = run_command(make, check=False)
        if result.returncode != 0:
            raise NetworkLabError(f"could not give host {host.name} a private /dev/shm: "
                                  f"{result.stderr.strip()}")

    def set_link(self, host: Host | str, link: Link) -> None:
        """Shape ``host``'s link to ``link``'s rate, both ways (mid-run too)."""
        host = self._host(host)
        shape(host.namespace, "eth0", link)
        shape(self.switch, host.port, link)
        host.link = link

    def cut(self, host: Host | str) -> None:
        """Take ``host``'s link down (its connections stall; the host stays up)."""
        host = self._host(host)
        netlink().set_up(self.switch, host.port, up=False)
        logger.info("netlab: cut %s off the network", host.name)

    def restore(self, host: Host | str) -> None:
        """Bring ``host``'s link back up."""
        host = self._host(host)
        netlink().set_up(self.switch, host.port)
        logger.info("netlab: %s is back on the network", host.name)

    def _host(self, host: Host | str) -> Host:
        if isinstance(host, Host):
            return host
        try:
            return self.hosts[host]
        except KeyError:
            raise NetworkLabError(
                f"no host {host!r} in the lab (hosts: {list(self.hosts)})") from None

    def wait_until(self, condition, *, timeout_s: float, what: str, interval_s: float = 0.1):
        """Poll ``condition()`` until truthy, else raise NetworkLabError naming ``what``."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise NetworkLabError(f"{what} did not happen within {timeout_s:.0f} s")
            time.sleep(interval_s)
