"""Running at an analysis facility: batch Dask clusters, server checks, live server monitoring.

* :func:`make_cluster` -- Dask workers as local processes, SLURM or HTCondor jobs, or an existing
  scheduler; model-server settings reach the workers, secrets by variable name only.
* :func:`check_servers` / ``coffea-sonic check`` -- can this node use the Triton servers?
* :func:`monitor` / ``coffea-sonic monitor`` -- throughput, batch, queue and compute time per model.
* :class:`TokenGateway` -- a loopback shared-secret gRPC gateway, a test fixture (a facility's
  gateway is HAProxy with ``deploy/haproxy/gateway.cfg``: JWT tokens, per-user quotas).

>>> from coffea_sonic import facility
>>> facility.parse_target("gpu1:8001").address
'gpu1:8001'
"""

from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "FacilityCluster": "cluster", "make_cluster": "cluster", "deliver_settings": "cluster",
    "WorkerEnvironment": "environment", "worker_environment": "environment",
    "CheckOptions": "check", "ServerReport": "check", "check_server": "check",
    "check_servers": "check", "check_on_workers": "check", "parse_target": "check",
    "render_reports": "check", "configured_targets": "check",
    "monitor": "monitor", "scrape": "monitor", "figures": "monitor", "render_frame": "monitor",
    "TokenGateway": "gateway",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(
    __name__, {name: f".{module}" for name, module in _EXPORTS.items()}, globals())
