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
import sys
from pathlib import Path
from typing import Sequence

from coffea_sonic.netlab.gateway import Gateway, start_gateway
from coffea_sonic.netlab.lab import Host, Lab
from coffea_sonic.netlab.links import Link
from coffea_sonic.netlab.processes import HostProcess
from coffea_sonic.netlab.processes import CommandUnavailableError
from coffea_sonic.netlab.services import TritonHost, ensure_command, start_triton
from coffea_sonic.netlab.tokens import TokenIssuer

logger = logging.getLogger(__name__)

WORKER_HOSTS = ("worker1", "worker2")
SERVER_HOSTS = ("gpu1", "gpu2")
AUDIENCE = "coffea-sonic"
SCHEDULER_PORT = 8786
PROMETHEUS_PORT = 9090


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


def _dask_command() -> str:
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        raise CommandUnavailableError(f"no dask command beside {sys.executable} "
                                      "(pip install distributed)")
    return str(dask)


def start_scheduler(host: Host, *, worker_ttl: str = "15s") -> str:
    """A Dask scheduler on ``host``; returns its ``tcp://ip:8786`` address.

    ``worker_ttl``: how long a silent worker (its host cut off) keeps its tasks before the
    scheduler gives them to others (Dask's default, 5 minutes, outlasts most runs).
    """
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORKER_TTL": worker_ttl}
    process = host.popen([_dask_command(), "scheduler", "--host", host.ip, "--port",
                          str(SCHEDULER_PORT), "--no-dashboard"], name="dask-scheduler", env=env)
    process.wait_for_port(SCHEDULER_PORT)
    return f"tcp://{host.address(SCHEDULER_PORT)}"


def start_worker(host: Host, scheduler: str, *, name: str | None = None, threads: int = 1,
                 env: dict | None = None) -> HostProcess:
    """A Dask worker (no nanny) on ``host`` joined to ``scheduler``; ``env`` is added to this
    process' environment (tokens, settings)."""
    worker_name = name or host.name
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return host.popen([_dask_command(), "worker", scheduler, "--host", host.ip, "--name",
                       worker_name, "--nthreads", str(threads), "--no-nanny", "--no-dashboard",
                       "--death-timeout", "120"], name=f"dask-worker-{worker_name}",
                      env=environment, grace_s=3.0)  # its goodbye to a stopped scheduler hangs


def start_prometheus(host: Host, targets: Sequence[str], directory: Path) -> str:
    """Prometheus on ``host`` scraping ``targets`` (``ip:port`` metrics endpoints) with the job
    of ``deploy/prometheus.yml``; returns its ``http://ip:9090`` address."""
    import yaml

    prometheus = ensure_command("prometheus", "prometheus")
    deploy = Path(__file__).resolve().parents[1] / "deploy" / "prometheus.yml"
    config = yaml.safe_load(deploy.read_text())
    config["scrape_configs"][0]["static_configs"][0]["targets"] = list(targets)
    config["global"]["scrape_interval"] = "1s"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    process = host.popen([prometheus, f"--config.file={directory / 'prometheus.yml'}",
                          f"--storage.tsdb.path={directory / 'data'}",
                          f"--web.listen-address={host.address(PROMETHEUS_PORT)}"],
                         name="prometheus")
    process.wait_for_port(PROMETHEUS_PORT)
    return f"http://{host.address(PROMETHEUS_PORT)}"
