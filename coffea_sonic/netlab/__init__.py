"""Hosts and links on one machine: network namespaces with private ``/dev/shm``, links shaped by
tbf, round-trip times from a user-space relay, and the facility's processes started inside hosts.

Needs root (tests that use it are marked ``netlab``); without root, :class:`LocalHost` stands for
this machine. How it works, with examples: docs/internals/netlab.md.
"""

from .lab import Host, Lab, missing_requirements, sweep_stale_labs
from .links import Link
from .processes import HostProcess, LocalHost, port_open
from .relay import start_relay

__all__ = ["Host", "HostProcess", "Lab", "Link", "LocalHost", "missing_requirements", "port_open",
           "start_relay", "sweep_stale_labs"]
