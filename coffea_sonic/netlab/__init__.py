"""Hosts and links on one machine: network namespaces with private ``/dev/shm``, links shaped by
tbf, round-trip times from a user-space relay, and the facility's processes started inside hosts.

Needs root (tests that use it are marked ``netlab`` and skip elsewhere). The pieces:

* :class:`Lab` (context manager): hosts on one switch; ``lab.host(name, Link(rate_mbit))``,
  ``lab.set_link(host, link)`` (mid-run too), ``lab.cut(host)`` / ``lab.restore(host)``.
* :class:`Host`: ``host.ip``, ``host.popen(argv, name=...)`` (a :class:`HostProcess` the lab stops),
  ``host.run(argv)``, ``host.command_prefix()``.
* :class:`Link`: ``rate_mbit`` (None: unshaped) and ``rtt_ms`` (what relays to the host add).
* :func:`start_relay`: a TCP relay on a host that adds a round-trip time to a service.

>>> from coffea_sonic.netlab import Lab, Link, start_relay
>>> with Lab() as lab:                                           # doctest: +SKIP
...     gpu = lab.host("gpu1", Link(rate_mbit=1000, rtt_ms=20))
...     far = start_relay(gpu, target="127.0.0.1:8001", listen_port=9001)
...     far                                                  # 20 ms away, at 1 Gb/s
'10.231.0.10:9001'

Without root, :class:`LocalHost` stands for this machine (loopback, no namespaces):

>>> import socket
>>> with LocalHost() as here, socket.create_server(("127.0.0.1", 0)) as listening:
...     port = listening.getsockname()[1]
...     port_open(here.address(port))
True
>>> Link(rate_mbit=1000, rtt_ms=20).shaped, Link().shaped
(True, False)
"""

from .lab import Host, Lab, missing_requirements, sweep_stale_labs
from .links import Link
from .processes import HostProcess, LocalHost, port_open
from .relay import start_relay

__all__ = ["Host", "HostProcess", "Lab", "Link", "LocalHost", "missing_requirements", "port_open",
           "start_relay", "sweep_stale_labs"]
