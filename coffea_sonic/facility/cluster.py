"""Dask clusters as a facility runs them: local processes, SLURM or HTCondor batch jobs, or a scheduler.

How to use it: docs/facility/workers.md; how settings reach the workers: docs/internals/facility.md.

>>> with make_cluster("local", workers=1) as cluster:
...     cluster.client.submit(sum, [1, 2]).result()
3
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ClusterStartError, ConfigurationError, require
from .environment import WorkerEnvironment, worker_environment
from .main_guard import check_main_guard

logger = logging.getLogger(__name__)

__all__ = ["BATCH_KINDS", "FacilityCluster", "deliver_settings", "local_worker_memory",
           "make_cluster", "slurm_is_single_node_here"]

#: Kinds :func:`make_cluster` builds itself; anything else with a ``:`` is a scheduler address.
BATCH_KINDS: tuple[str, ...] = ("local", "slurm", "htcondor")
#: Seconds :func:`make_cluster` waits for the workers by default (batch queues may be slower).
DEFAULT_WAIT_S = 180.0
#: What local workers leave to everything else on the machine (this process, a Triton server, the
#: system): the larger of these two.
LOCAL_RESERVE_BYTES = 2 * 2**30
LOCAL_RESERVE_FRACTION = 0.10
#: Below this per worker a local cluster is short of memory (warned, not refused).
LOCAL_MIN_WORKER_BYTES = 1 * 2**30
#: Memory a batch job asks for per worker unless told (the submitting node cannot know the nodes').
BATCH_MEMORY = "2GiB"


def local_worker_memory(workers: int, total_bytes: int | None = None) -> int:
    """Memory limit of each of ``workers`` local Dask workers: ``(total - reserve) / workers``.

    ``total_bytes``: the memory this machine gives Dask (default ``distributed.system.MEMORY_LIMIT``:
    physical memory, or less under a cgroup or rlimit); the reserve is the larger of
    ``LOCAL_RESERVE_BYTES`` and ``LOCAL_RESERVE_FRACTION`` of it (why: docs/internals/facility.md).

    >>> round(local_worker_memory(4, total_bytes=64 * 2**30) / 2**30, 2)
    14.4
    >>> local_worker_memory(2, total_bytes=8 * 2**30) / 2**30
    3.0
    """
    if workers < 1:
        raise ConfigurationError(f"workers must be >= 1 to size their memory, not {workers!r}")
    if total_bytes is None:
        from distributed.system import MEMORY_LIMIT

        total_bytes = int(MEMORY_LIMIT)
    reserve = max(LOCAL_RESERVE_BYTES, int(total_bytes * LOCAL_RESERVE_FRACTION))
    share = max(total_bytes - reserve, 0) // workers
    if share < LOCAL_MIN_WORKER_BYTES:
        logger.warning(
            "%d local workers get %.2f GiB each of this machine's %.1f GiB (%.1f GiB kept for the "
            "rest); they may pause or spill: ask for fewer workers", workers, share / 2**30,
            total_bytes / 2**30, reserve / 2**30)
    return max(share, 256 * 2**20)


def slurm_is_single_node_here() -> bool:
    """Whether every SLURM node is this host (then scheduler and workers can stay on loopback).

    >>> isinstance(slurm_is_single_node_here(), bool)
    True
    """
    sinfo = shutil.which("sinfo")
    if not sinfo:
        return False
    try:
        listing = subprocess.run([sinfo, "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                                 timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    nodes = {line.strip() for line in listing.stdout.splitlines() if line.strip()}
    here = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost"}
    return listing.returncode == 0 and bool(nodes) and nodes <= here


def _is_address(kind: str) -> bool:
    return "://" in kind or ":" in kind


class FacilityCluster:
    """A Dask cluster with its client; a context manager that closes both (and cancels batch jobs).

    ``kind``: local | slurm | htcondor | address. ``cluster`` is the underlying
    ``LocalCluster``/``SLURMCluster``/``HTCondorCluster`` (None for an address). ``environment`` is
    the :class:`WorkerEnvironment` the workers were given.

    >>> FacilityCluster.__enter__.__doc__ is None
    True
    """

    def __init__(self, kind: str, cluster: Any, client: Any, environment: WorkerEnvironment,
                 workers: int) -> None:
        self.kind = kind
        self.cluster = cluster
        self.client = client
        self.environment = environment
        self.workers_requested = workers

    def __repr__(self) -> str:
        limits = sorted(set(self.worker_memory().values()))
        memory = (f", memory={'/'.join(f'{limit / 2**30:.1f}' for limit in limits)} GiB/worker"
                  if limits and all(limits) else "")
        return (f"FacilityCluster(kind={self.kind!r}, workers={self.n_workers()}/"
                f"{self.workers_requested}{memory}, scheduler={self.client.scheduler.address})")

    def __enter__(self) -> "FacilityCluster":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def dashboard_link(self) -> str | None:
        """The Dask dashboard URL (None if the dashboard is off)."""
        return getattr(self.client, "dashboard_link", None)

    def n_workers(self) -> int:
        """Workers connected to the scheduler now."""
        return len(self.client.scheduler_info(n_workers=-1)["workers"])

    def worker_memory(self) -> dict[str, int]:
        """Memory limit of each connected worker, in bytes (0: none), by worker address."""
        return {address: int(info.get("memory_limit") or 0)
                for address, info in self.client.scheduler_info(n_workers=-1)["workers"].items()}

    def job_script(self) -> str:
        """The batch job script (SLURM) or submit description (HTCondor) one worker is started with."""
        script = getattr(self.cluster, "job_script", None)
        if script is None:
            raise ConfigurationError(f"a {self.kind} cluster has no job script; only slurm and "
                                     "htcondor clusters submit jobs")
        return script()

    def worker_jobs(self) -> dict[str, str]:
        """Batch job id of each connected worker, by worker address (batch kinds only).

        dask-jobqueue names each worker after its job, which is how a worker is mapped to the
        job to cancel or inspect (``scancel``, ``condor_rm``).
        """
        jobs_by_name = {str(name): getattr(job, "job_id", None)
                        for name, job in getattr(self.cluster, "workers", {}).items()}
        mapping = {}
        for address, info in self.client.scheduler_info(n_workers=-1)["workers"].items():
            name = str(info.get("name", ""))
            # one worker per job: the worker name is the job name (or starts with it + "-<i>")
            for job_name, job_id in jobs_by_name.items():
                if job_id and (name == job_name or name.startswith(job_name + "-")):
                    mapping[address] = str(job_id)
        return mapping

    def scale(self, workers: int) -> None:
        """Ask for ``workers`` workers (batch jobs are submitted or cancelled)."""
        if self.cluster is None:
            raise ConfigurationError("a cluster reached through a scheduler address is scaled by "
                                     "whoever runs it, not from here")
        self.workers_requested = workers
        self.cluster.scale(workers)

    def wait_for_workers(self, workers: int | None = None, timeout_s: float = DEFAULT_WAIT_S) -> None:
        """Block until ``workers`` (default: as requested) are connected; raise ClusterStartError."""
        wanted = self.workers_requested if workers is None else workers
        try:
            self.client.wait_for_workers(wanted, timeout=timeout_s)
        except TimeoutError:
            raise ClusterStartError(self._timeout_report(wanted, timeout_s)) from None

    def _timeout_report(self, wanted: int, timeout_s: float) -> str:
        have = self.n_workers()
        lines = [f"only {have} of {wanted} Dask workers connected to the {self.kind} cluster "
                 f"within {timeout_s:.0f} s (scheduler {self.client.scheduler.address})."]
        if self.kind == "slurm":
            lines.append("What to do: check the jobs with `squeue --me` (pending: the queue is busy "
                         "or the request exceeds the partition; pass queue=/memory=/walltime=), and "
                         "the job logs (pass log_directory=); a worker that started but never "
                         "connected usually cannot reach the scheduler's address from its node.")
            lines.append(self._squeue())
        elif self.kind == "htcondor":
            lines.append("What to do: `condor_q -better-analyze` tells why jobs do not start; the "
                         "worker logs are in log_directory=.")
        elif self.kind == "local":
            lines.append("What to do: the machine may be short of memory or cores; ask for fewer "
                         "workers or less memory per worker.")
        else:
            lines.append("What to do: the scheduler at that address has fewer workers; ask the "
                         "facility (or its dashboard) for more, or request fewer.")
        return "\n".join(line for line in lines if line)

    def _squeue(self) -> str:
        job_ids = [str(job.job_id) for job in getattr(self.cluster, "workers", {}).values()
                   if getattr(job, "job_id", None)]
        if not job_ids or not shutil.which("squeue"):
            return ""
        listing = subprocess.run(["squeue", "-j", ",".join(job_ids), "-o", "%i %T %R"],
                                 capture_output=True, text=True, timeout=20)
        return "squeue: " + " | ".join(listing.stdout.strip().splitlines())

    def close(self) -> None:
        """Close the client and the cluster (batch jobs are cancelled). Idempotent."""
        try:
            self.client.close()
        finally:
            if self.cluster is not None:
                try:
                    self.cluster.close()
                except (TimeoutError, asyncio.TimeoutError):
                    # Seen with 60 workers each holding a CUDA context: some take longer than
                    # Dask's few seconds to exit and are killed. The work is done by then;
                    # failing here would throw its results away.
                    logger.warning("Dask cluster: some workers did not exit in time and were "
                                   "killed; results are unaffected")


def deliver_settings(client: Any, env: Mapping[str, str] | Iterable[str] | None = None, *,
                     include_settings: bool = True) -> WorkerEnvironment:
    """Give every worker of ``client`` (now and later) this process's plain coffea-sonic settings.

    For clusters made elsewhere (lpcjobqueue's ``LPCCondorCluster``, coffea-casa, a Dask
    gateway): a worker plugin sets the variables on each worker. Secret values are never sent
    over Dask; names in ``env`` are only checked on the workers (a warning names missing ones).
    Returns the environment that was sent.

    >>> from distributed import Client
    >>> with Client(processes=False, n_workers=1, dashboard_address=":0") as client:
    ...     sorted(deliver_settings(client, {"COFFEA_SONIC_SERVERS": "gpu1:8001"}).values)
    ['COFFEA_SONIC_SERVERS']
    """
    environment = worker_environment(env, include_settings=include_settings)
    client.register_plugin(environment.plugin())
    return environment


def _jobqueue_cluster_class(kind: str) -> type:
    dask_jobqueue = require("dask_jobqueue", f"a {kind} cluster")
    return {"slurm": dask_jobqueue.SLURMCluster, "htcondor": dask_jobqueue.HTCondorCluster}[kind]


def site_setting(kind: str, key: str, default: Any = None) -> Any:
    """The site's dask-jobqueue setting ``jobqueue.<kind>.<key>`` (its ``jobqueue.yaml``, or
    ``DASK_JOBQUEUE__...`` variables), else ``default``.

    >>> import dask.config
    >>> with dask.config.set({"jobqueue.slurm.queue": "short"}):
    ...     site_setting("slurm", "queue"), site_setting("slurm", "account", "none")
    ('short', 'none')
    """
    import dask.config

    value = dask.config.get(f"jobqueue.{kind}.{key}", None)
    return default if value is None else value


def _batch_options(kind: str, environment: WorkerEnvironment, *, cores: int | None,
                   processes: int | None, memory: str | int | None, walltime: str | None,
                   queue: str | None, account: str | None, log_directory: str | None,
                   loopback: bool, kw: dict[str, Any]) -> dict[str, Any]:
    """dask-jobqueue keywords: what was asked, None for the rest so the site's ``jobqueue.yaml``
    applies; list and mapping options the site sets are extended, not replaced."""
    options: dict[str, Any] = dict(
        # dask-jobqueue refuses a job without cores and memory: ours when neither says
        cores=cores if cores is not None else (None if site_setting(kind, "cores") else 1),
        memory=memory if memory is not None else (
            None if site_setting(kind, "memory") else BATCH_MEMORY),
        log_directory=log_directory)
    if processes is not None:
        options["processes"] = processes
    if loopback:
        options["scheduler_options"] = {
            **site_setting(kind, "scheduler-options", {}), "host": "127.0.0.1",
            "dashboard_address": "127.0.0.1:0", **kw.pop("scheduler_options", {})}
        options["worker_extra_args"] = [
            *kw.pop("worker_extra_args", site_setting(kind, "worker-extra-args", [])),
            "--host", "127.0.0.1"]
    if kind == "slurm":
        options.update(walltime=walltime, queue=queue, account=account)
        options.update(_slurm_lists(environment, kw))
    else:
        options.update(_htcondor_directives(environment, walltime=walltime, queue=queue, kw=kw))
    options.update(kw)
    return options


def _slurm_lists(environment: WorkerEnvironment, kw: dict[str, Any]) -> dict[str, list[str]]:
    """The prologue and directives: the site's (or the caller's) lines, then the workers' settings."""
    prologue = kw.pop("job_script_prologue", None)
    if prologue is None:
        prologue = site_setting("slurm", "job-script-prologue", [])
    directives = kw.pop("job_extra_directives", None)
    if directives is None:
        directives = site_setting("slurm", "job-extra-directives", [])
    directives = list(directives)
    if environment.forwarded and "--export=ALL" not in directives:
        # the default, made explicit: sites that set SBATCH_EXPORT=NONE would drop the secrets
        directives.append("--export=ALL")
    return {"job_script_prologue": [*prologue, *environment.slurm_prologue()],
            "job_extra_directives": directives}


def _htcondor_directives(environment: WorkerEnvironment, *, walltime: str | None,
                         queue: str | None, kw: dict[str, Any]) -> dict[str, Any]:
    """Submit-description lines: the site's (or the caller's), the workers' environment merged
    into the site's ``environment``, run time and flavour when asked."""
    given = kw.pop("job_extra_directives", None)
    directives = dict(site_setting("htcondor", "job-extra-directives", {}) if given is None
                      else given)
    if environment.values or environment.forwarded:
        ours = environment.htcondor_environment()
        site = str(directives.get("environment", "")).strip().strip('"').strip()
        directives["environment"] = f'"{site} {ours.strip(chr(34))}"' if site else ours
    if walltime:
        hours, minutes, seconds = (int(part) for part in walltime.split(":"))
        directives.setdefault("+MaxRuntime", hours * 3600 + minutes * 60 + seconds)
    if queue:
        directives.setdefault("+JobFlavour", f'"{queue}"')
    result: dict[str, Any] = {"job_extra_directives": directives}
    if kw.get("disk") is None and not site_setting("htcondor", "disk"):
        kw["disk"] = "1GiB"  # dask-jobqueue refuses a job without disk
    return result


def make_cluster(
    kind: str = "local",
    workers: int = 2,
    *,
    cores_per_worker: int | None = None,
    processes: int | None = None,
    memory: str | int | None = None,
    walltime: str | None = None,
    env: Mapping[str, str] | Iterable[str] | None = None,
    queue: str | None = None,
    account: str | None = None,
    log_directory: str | os.PathLike | None = None,
    loopback: bool | None = None,
    include_settings: bool = True,
    wait: bool = True,
    timeout_s: float = DEFAULT_WAIT_S,
    **kw: Any,
) -> FacilityCluster:
    """Start (or connect to) a Dask cluster with ``workers`` workers and return it.

    ``kind``: ``"local"`` (processes on this machine), ``"slurm"`` / ``"htcondor"`` (batch jobs
    through dask-jobqueue), or a scheduler address (``"tcp://host:8786"``, as given by
    coffea-casa or a facility's Dask gateway). ``env``: plain variables for the workers (mapping)
    or names of secret variables to forward from this environment (iterable); coffea-sonic's own
    settings are included unless ``include_settings=False``. ``loopback`` binds scheduler and
    workers to 127.0.0.1 (default: for local, and for SLURM when its only node is this host).
    ``workers=0`` builds the cluster without submitting jobs (e.g. to inspect ``job_script()``).

    Batch options left None are the site's ``jobqueue.yaml`` values, its prologue and directives
    extended, not replaced (docs/facility/workers.md); where the site sets no cores, memory or
    disk: 1 core, ``BATCH_MEMORY``, 1 GiB. Local workers: ``cores_per_worker`` threads each
    (default 1), this machine's memory shared (:func:`local_worker_memory`) unless ``memory`` says
    otherwise, ``processes=False`` keeps them in this process. Other keywords go to the cluster
    class.

    >>> with make_cluster("local", workers=1, processes=False) as cluster:
    ...     cluster.client.submit(sum, [1, 2]).result()
    3
    """
    environment = worker_environment(env, include_settings=include_settings)
    for name in environment.missing_here():
        logger.warning("%s is to be forwarded to the workers but is not set here; export it "
                       "before starting the cluster", name)
    batch = dict(cores=cores_per_worker, processes=processes, memory=memory, walltime=walltime,
                 queue=queue, account=account, loopback=loopback,
                 log_directory=os.fspath(log_directory) if log_directory is not None else None)
    cluster, client = _cluster_and_client(kind, workers, environment, batch, timeout_s, kw)
    if cluster is None:  # settings reach running workers by plugin; secrets never go over Dask
        deliver_settings(client, env, include_settings=include_settings)
    facility_cluster = FacilityCluster(kind if cluster is not None else "address", cluster, client,
                                       environment, workers)
    logger.info("Dask %s cluster: scheduler %s, dashboard %s", facility_cluster.kind,
                client.scheduler.address, facility_cluster.dashboard_link)
    if wait and workers:
        _wait_or_close(facility_cluster, workers, timeout_s)
    return facility_cluster


def _cluster_and_client(kind: str, workers: int, environment: WorkerEnvironment,
                        batch: dict[str, Any], timeout_s: float,
                        kw: dict[str, Any]) -> tuple[Any, Any]:
    """The cluster (None for a scheduler address) and a client of it, for ``make_cluster``."""
    if kind == "local":
        if batch["processes"] is not None:
            kw["processes"] = bool(batch["processes"])
        return _local_cluster(workers, batch["cores"] or 1, batch["memory"], environment,
                              batch["loopback"], kw)
    if kind in ("slurm", "htcondor"):
        loopback = batch.pop("loopback")
        if loopback is None:
            loopback = kind == "slurm" and slurm_is_single_node_here()
        options = _batch_options(kind, environment, loopback=bool(loopback), kw=kw, **batch)
        return _batch_cluster(kind, workers, options)
    if _is_address(kind):
        return None, _scheduler_client(kind, timeout_s, kw)
    raise ConfigurationError(
        f"cluster kind {kind!r} is not one of {', '.join(BATCH_KINDS)} nor a scheduler address "
        "(tcp://host:port)")


def _local_cluster(workers: int, threads: int, memory: str | int | None,
                   environment: WorkerEnvironment, loopback: bool | None,
                   kw: dict[str, Any]) -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    if kw.get("processes", True):  # spawned workers import the script again
        check_main_guard()
    if memory is None:
        memory = local_worker_memory(max(workers, 1))
        logger.info("local Dask workers: %.2f GiB each (this machine's memory less a reserve, "
                    "shared by %d)", memory / 2**30, max(workers, 1))
    options: dict[str, Any] = dict(n_workers=workers, threads_per_worker=threads,
                                   memory_limit=memory)
    if kw.get("processes", True):
        # in-process workers share this environment; worker processes get the values here
        options["env"] = dict(environment.values)
        if loopback is not False:
            options["host"] = "127.0.0.1"
    options["dashboard_address"] = kw.pop("dashboard_address", ":0")
    options.update(kw)
    cluster = LocalCluster(**options)
    return cluster, Client(cluster)


def _batch_cluster(kind: str, workers: int, options: dict[str, Any]) -> tuple[Any, Any]:
    from distributed import Client

    cluster = _jobqueue_cluster_class(kind)(**options)
    client = Client(cluster)
    if workers:
        cluster.scale(workers)
    return cluster, client


def _scheduler_client(address: str, timeout_s: float, kw: dict[str, Any]) -> Any:
    from distributed import Client

    if kw:
        raise ConfigurationError(f"connecting to scheduler {address} takes no cluster options, "
                                 f"got {sorted(kw)}")
    try:
        return Client(address, timeout=f"{min(timeout_s, 60):.0f}s")
    except (OSError, TimeoutError) as error:
        raise ClusterStartError(
            f"cannot reach the Dask scheduler at {address}: {error}. Check the address (coffea-"
            f"casa shows it in its Dask panel; a gateway gives it with cluster.scheduler_address)"
        ) from None


def _wait_or_close(cluster: FacilityCluster, workers: int, timeout_s: float) -> None:
    started = time.monotonic()
    try:
        cluster.wait_for_workers(workers, timeout_s)
    except ClusterStartError:
        cluster.close()
        raise
    logger.info("%d workers connected after %.1f s", workers, time.monotonic() - started)
