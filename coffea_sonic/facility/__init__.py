"""Running at an analysis facility: batch Dask clusters (:func:`make_cluster`), server checks
(:func:`check_servers`), live server monitoring (:func:`monitor`), a test gateway
(:class:`TokenGateway`).

How it works: docs/internals/facility.md; the user's side: docs/facility/.
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
