"""A whole facility in one lab: Dask on a head host and two worker hosts, two GPU-server hosts
behind an HAProxy gateway with JWT tokens and per-user quotas, Prometheus scraping them.

::

    submit (this process, 10.231.N.1) ─┐
    head      scheduler, Prometheus   ─┤
    worker1   Dask worker              ─┤  switch   (each host's link shaped by tbf)
    worker2   Dask worker              ─┤
    gateway   HAProxy (JWT, quotas)    ─┤
    gpu1      tritonserver             ─┤
    gpu2      tritonserver             ─┘

Workers read the same files as the submitting process (one filesystem, like a shared one at a
facility) but share no memory with the servers: ``transport="auto"`` sends over gRPC. Their token
comes from ``COFFEA_SONIC_TOKEN_FILE``.

>>> with Facility(models=["jet_tagger"]) as facility:                  # doctest: +SKIP
...     facility.gateway.url("jet_tagger")
'triton+grpc://10.231.0.13:8001/jet_tagger'

Nothing starts before it is entered (or started); by default every link runs at 1 Gb/s:

>>> facility = Facility(models=["jet_tagger"], quota_rps=50)
>>> facility.lab, facility.server_link, facility.worker_link, facility.quota_rps
(Lab(index=-1, hosts=[]), Link(rate_mbit=1000, rtt_ms=0.0), Link(rate_mbit=1000, rtt_ms=0.0), 50)
>>> WORKER_HOSTS, SERVER_HOSTS
(('worker1', 'worker2'), ('gpu1', 'gpu2'))
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

from coffea_sonic.netlab.gateway import Gateway, start_gateway
from coffea_sonic.netlab.lab import Host, Lab
from coffea_sonic.netlab.links import Link
from coffea_sonic.netlab.processes import HostProcess
from coffea_sonic.netlab.services import (TritonHost, start_prometheus, start_scheduler,
                                          start_triton, start_worker)
from coffea_sonic.netlab.tokens import TokenIssuer

logger = logging.getLogger(__name__)

WORKER_HOSTS = ("worker1", "worker2")
SERVER_HOSTS = ("gpu1", "gpu2")
AUDIENCE = "coffea-sonic"


class Facility:
    """Starts the hosts and services above; a context manager that stops all of them.

    ``server_link`` / ``worker_link``: the GPU and worker hosts' links (1 Gb/s by default).
    ``quota_rps``: the gateway's inference requests/s per token subject. ``prometheus``: start
    Prometheus on the head host. ``workers``: whether to start the Dask workers (a test may start
    its own). ``logs``: where the processes' logs go (kept; default: the lab's folder, removed).
    """

    def __init__(self, models: Sequence[str], *, server_link: Link = Link(1000),
                 worker_link: Link = Link(1000), quota_rps: int = 1000,
                 retry_after_s: float = 1, prometheus: bool = True, workers: bool = True,
                 subject: str = "analysis", logs: str | os.PathLike | None = None) -> None:
        self.models = list(models)
        self.server_link, self.worker_link = server_link, worker_link
        self.quota_rps, self.retry_after_s = quota_rps, retry_after_s
        self.with_prometheus, self.with_workers = prometheus, workers
        self.subject = subject
        self.lab = Lab(logs=logs)
        self.tritons: list[TritonHost] = []
        self.workers: list[HostProcess] = []
        self.gateway: Gateway | None = None
        self.scheduler = ""
        self.prometheus = ""
        self.issuer: TokenIssuer | None = None
        self.token_file: Path | None = None

    def __enter__(self) -> "Facility":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def host(self, name: str) -> Host:
        return self.lab.hosts[name]

    @property
    def worker_env(self) -> dict[str, str]:
        """What the workers' environment adds: the token file (the gateway needs one)."""
        return {"COFFEA_SONIC_TOKEN_FILE": str(self.token_file)}

    def start(self) -> "Facility":
        self.lab.start()
        try:
            self._start_services()
        except BaseException:
            self.lab.stop()
            raise
        return self

    def _start_services(self) -> None:
        lab = self.lab
        head = lab.host("head")
        workers = [lab.host(name, self.worker_link) for name in WORKER_HOSTS]
        servers = [lab.host(name, self.server_link) for name in SERVER_HOSTS]
        gateway_host = lab.host("gateway")
        self.issuer = TokenIssuer(lab.state / "issuer")
        self.token_file = self.issuer.write(lab.state / "token", self.subject, audience=AUDIENCE)
        # both servers start at once (most of a facility's start-up time)
        self.tritons = [start_triton(host, self.models, wait=False) for host in servers]
        self.scheduler = start_scheduler(head)
        if self.with_workers:
            self.workers = [start_worker(host, self.scheduler, env=self.worker_env)
                            for host in workers]
        for triton in self.tritons:
            triton.wait_ready()
        self.gateway = start_gateway(
            gateway_host, [t.grpc_address for t in self.tritons],
            public_key=self.issuer.public_key, directory=lab.state / "gateway",
            audience=AUDIENCE, quota_rps=self.quota_rps, retry_after_s=self.retry_after_s)
        if self.with_prometheus:
            targets = [t.metrics_address for t in self.tritons] + [self.gateway.stats_address]
            self.prometheus = start_prometheus(head, targets, lab.state / "prometheus")
        logger.info("netlab facility up: scheduler %s, gateway %s, servers %s", self.scheduler,
                    self.gateway.address, [t.grpc_address for t in self.tritons])

    def stop(self) -> None:
        """Stop every process and remove every host. Idempotent."""
        self.lab.stop()

    def url(self, model: str) -> str:
        """``model`` behind the gateway."""
        return self.gateway.url(model)
