"""``coffea-sonic check``: can this machine (a worker node) use the facility's Triton servers?

How it works, with an example: docs/internals/facility.md; what a user sees: docs/facility/check.md.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from ..config import DASK_PREFIX, configured_models, configured_servers
from ..core.endpoint import configured_tls
from ..errors import ConfigurationError
from .check_network import check_protocol, check_reachable, check_tls
from .check_report import (CheckOptions, Finding, ServedModel, ServerReport, Target, parse_target,
                           render_report, render_reports)

logger = logging.getLogger(__name__)

__all__ = ["CheckOptions", "Finding", "ServedModel", "ServerReport", "Target", "check_on_workers",
           "check_server", "check_servers", "configured_targets", "parse_target", "render_report",
           "render_reports"]


def configured_targets() -> list[str]:
    """Every server URL this environment is configured with (what a worker would use).

    Sources as in :mod:`coffea_sonic.config`: ``COFFEA_SONIC_MODEL_<NAME>``, Dask config
    ``coffea_sonic.models``, the facility file's ``[models]``, and ``COFFEA_SONIC_SERVERS``.

    >>> import os
    >>> os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"] = "triton+grpc://gpu1:8001/jet_tagger"
    >>> configured_targets()
    ['triton+grpc://gpu1:8001/jet_tagger']
    >>> del os.environ["COFFEA_SONIC_MODEL_JET_TAGGER"]
    """
    urls = [url for model_urls in configured_models().values() for url in model_urls]
    urls += configured_servers()
    return list(dict.fromkeys(urls))


def check_server(target: str | Target, options: CheckOptions | None = None,
                 **option_values: Any) -> ServerReport:
    """Check one server; keywords build :class:`CheckOptions` when ``options`` is not given.

    >>> check_server("127.0.0.1:1", timeout_s=1).finding("reachable").advice.split(":")[0]
    'the server is down or listens on another port'
    """
    options = options or CheckOptions(**option_values)
    parsed = parse_target(target) if isinstance(target, str) else target
    report = ServerReport(target=parsed.label, address=parsed.address)
    if not check_reachable(parsed, options, report):
        return report
    server_tls = check_protocol(parsed, options, report)
    if server_tls is None:
        return report
    try:  # the options given, else what the workers are configured with
        tls = options.tls_options() or (configured_tls() if server_tls else None)
    except ConfigurationError as error:
        report.add("tls", "fail", str(error), "fix the TLS setting named above")
        return report
    if not check_tls(parsed, options, report, server_tls, tls):
        return report
    from .check_triton import check_triton  # imports the client: only once a server answers

    check_triton(parsed, options, report, tls if server_tls else None)
    return report


def check_servers(targets: Iterable[str] | None = None, options: CheckOptions | None = None,
                  **option_values: Any) -> list[ServerReport]:
    """Check each target (default: every server this environment is configured with).

    >>> [r.ok for r in check_servers(["127.0.0.1:1"], timeout_s=1)]
    [False]
    """
    options = options or CheckOptions(**option_values)
    chosen = list(targets) if targets else configured_targets()
    if not chosen:
        raise ConfigurationError(
            "no server to check: give URLs (coffea-sonic check triton+grpc://host:8001/model) or "
            f"configure them (COFFEA_SONIC_MODEL_<NAME>, COFFEA_SONIC_SERVERS, dask config "
            f"{DASK_PREFIX}.models, or the facility file)")
    return [check_server(target, options) for target in chosen]


def _run_on_worker(targets: list[str], options: CheckOptions) -> list[ServerReport]:
    reports = check_servers(targets, options)
    for report in reports:
        report.where = socket.gethostname()
    return reports


def check_on_workers(client: Any, targets: Sequence[str] | None = None,
                     options: CheckOptions | None = None, **option_values: Any
                     ) -> dict[str, list[ServerReport]]:
    """Run the check on every Dask worker (what the analysis will see), by worker address.

    Targets default to this process's configuration; secrets are read on each worker from the
    variables named (forward them by name: ``make_cluster(env=[NAME])``). The transport reported
    is the one that worker's requests will use (shared memory only where the server is proven to
    be that worker's).
    """
    options = options or CheckOptions(**option_values)
    chosen = list(targets) if targets else configured_targets()
    return client.run(_run_on_worker, chosen, options)
