"""``coffea-sonic check`` and ``coffea-sonic monitor``: the facility commands.

>>> import argparse
>>> parser = argparse.ArgumentParser(prog="coffea-sonic")
>>> add_subparsers(parser.add_subparsers(dest="command"))
>>> parser.parse_args(["monitor", "127.0.0.1:8002", "--once"]).once
True
"""

from __future__ import annotations

import argparse
import sys

from ..cliargs import add_deprecated_alias, add_json_option, print_json

__all__ = ["add_batch_options", "add_subparsers", "batch_options", "run_check", "run_monitor"]

_CHECK_HELP = """\
Check, from this machine, every Triton server a worker would use, through the workers' own client
(same settings, same transports): reachability (DNS, TCP), protocol (gRPC, TLS, Triton's HTTP API,
or a wrong port such as Triton's HTTP or metrics port), TLS configuration and certificate, token
authentication, server health and version, the protocol groups the server restricts behind a key
(model-repository, statistics, shared-memory), the models and versions it serves (and whether the
model in the URL is served), round-trip latency of health calls and of a tiny inference, and the
transport the workers' requests will use (shared memory, gRPC, HTTP) with the reason when shared
memory is not usable (not this host, a proxy or balancer in front, restricted, /dev/shm). Every
failure says what to do. Exit code 0: usable; 1: something is wrong.

A bare host:port is the server's gRPC port here (monitor takes the metrics port). Without
servers, the servers configured for this environment are checked (COFFEA_SONIC_MODEL_<NAME>,
COFFEA_SONIC_SERVERS, dask config coffea_sonic.models, the facility file). Options left out are
taken from the workers' settings (COFFEA_SONIC_CA_FILE, COFFEA_SONIC_TOKEN_ENV,
COFFEA_SONIC_PROTOCOL_KEY_NAME/_ENV, ...).

examples:
  coffea-sonic check triton+grpc://127.0.0.1:8001/jet_tagger
  coffea-sonic check                                   # what this environment is configured with
  coffea-sonic check triton+grpcs://triton.example.org:443/jet_tagger --ca-file ca.pem \\
                     --token-env SONIC_TOKEN            # TLS + bearer token (value never printed)
  coffea-sonic check triton+grpc://gpu1:8001/jet_tagger --protocol-key-name k \\
                     --protocol-key-env TRITON_KEY      # a server started with ...:k=VALUE
  coffea-sonic check --server gpu1:8001 --server gpu2:8001 --pings 20  # more latency samples
  coffea-sonic check --on-workers slurm                 # run the check inside a SLURM job
  coffea-sonic check --on-workers slurm --queue short --account cms --walltime 00:10:00
"""

_MONITOR_HELP = """\
A live terminal view of Triton servers from their Prometheus metrics endpoint (Triton's
--metrics-port, 8002 by default): per model, inferences/s and requests/s, average batch
(inferences per execution), queue and compute time per request, queue time per execution
(SuperSONIC's autoscaling metric), failures and pending requests; CPU and GPU utilisation.
Given a Triton URL instead (triton+grpc://host:8001[/model]), the same figures come from Triton's
statistics API, reached as the workers reach it (TLS, token, restricted-protocol key settings):
for servers whose metrics port you cannot reach.

examples:
  coffea-sonic monitor http://127.0.0.1:8002/metrics
  coffea-sonic monitor triton+grpc://gpu1:8001           # statistics API, every model it serves
  coffea-sonic monitor --server gpu1:8002 --server gpu2:8002 --interval-s 5
  coffea-sonic monitor 127.0.0.1:8002 --once           # one frame over one interval, then exit
"""


def add_subparsers(subparsers: argparse._SubParsersAction) -> None:
    """Register ``check`` and ``monitor`` on the top-level CLI."""
    _add_check(subparsers)
    _add_monitor(subparsers)


def _add_check(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser(
        "check", help="diagnose access to Triton servers from this machine (or a worker)",
        description=_CHECK_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--server", action="append", dest="servers", default=[], metavar="URL",
                       help="a server to check: host:port (its gRPC port) or "
                            "triton+grpc[s]://host:port[/model[/version]] (triton+http[s]:// for "
                            "Triton's HTTP API); repeat for more (default: the configured ones)")
    check.add_argument("urls", nargs="*", metavar="URL",
                       help="shortcut for --server URL")
    check.add_argument("--token-env", metavar="NAME",
                       help="environment variable holding the bearer token (default: "
                            "$COFFEA_SONIC_TOKEN_ENV names it)")
    check.add_argument("--token-file", metavar="PATH", help="file holding the bearer token")
    check.add_argument("--protocol-key-name", metavar="KEY",
                       help="KEY of a server started with --grpc-restricted-protocol=GROUPS:KEY="
                            "VALUE (PyTriton: triton-access-token)")
    check.add_argument("--protocol-key-env", metavar="NAME",
                       help="environment variable holding that key's VALUE")
    check.add_argument("--protocol-key-file", metavar="PATH", help="file holding the key's VALUE")
    check.add_argument("--transport", choices=("auto", "grpc", "shm", "http"),
                       help="what the workers' TritonModel asks for (default: their transport "
                            "setting, COFFEA_SONIC_TRANSPORT, else auto)")
    renamed = {
        "--ssl": check.add_argument("--tls", action="store_true", default=None,
                                    help="use TLS even for triton+grpc:// or host:port targets"),
        "--ssl-ca": check.add_argument("--ca-file", metavar="FILE",
                                       help="PEM bundle of the CA(s) to trust (setting ca_file)"),
        "--ssl-cert": check.add_argument("--cert-file", metavar="FILE",
                                         help="client certificate, mutual TLS (setting cert_file)"),
        "--ssl-key": check.add_argument("--key-file", metavar="FILE",
                                        help="client private key, mutual TLS (setting key_file)"),
        "--ssl-target-name": check.add_argument(
            "--server-name", metavar="NAME",
            help="name to verify the server certificate against, for tunnels (setting "
                 "server_name)"),
        "--timeout": check.add_argument("--timeout-s", type=float, default=5.0, metavar="SECONDS",
                                        help="per-step timeout in seconds (default 5)"),
    }
    for old, new in renamed.items():
        add_deprecated_alias(check, old, new)
    check.add_argument("--pings", type=int, default=5, metavar="N",
                       help="health calls and tiny inferences timed per server (default 5)")
    check.add_argument("--on-workers", metavar="CLUSTER",
                       help="run the check on one Dask worker of this cluster instead: local, "
                            "slurm, htcondor or a scheduler address (the token variable is "
                            "forwarded by name)")
    add_batch_options(check)
    check.add_argument("--no-color", action="store_true", help="plain text even on a terminal")
    add_json_option(check)
    check.set_defaults(func=run_check)


def _add_monitor(subparsers: argparse._SubParsersAction) -> None:
    monitor = subparsers.add_parser(
        "monitor", help="live view of Triton server metrics (throughput, queue, batch, GPU)",
        description=_MONITOR_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    monitor.add_argument("--server", action="append", dest="servers", default=[], metavar="URL",
                         help="a server to watch: its metrics endpoint (http://host:8002/metrics, "
                              "or host:port of the metrics port), or a Triton URL "
                              "triton+grpc://host:port[/model] (statistics API); repeat for more")
    monitor.add_argument("urls", nargs="*", metavar="URL", help="shortcut for --server URL")
    interval = monitor.add_argument("--interval-s", type=float, default=2.0, metavar="SECONDS",
                                    help="seconds between scrapes (default 2)")
    add_deprecated_alias(monitor, "--interval", interval)
    monitor.add_argument("--once", action="store_true",
                         help="print one frame (over one interval) and exit")
    monitor.add_argument("--frames", type=int, metavar="N", help="stop after N frames")
    monitor.add_argument("--no-color", action="store_true", help="no ANSI colours")
    monitor.add_argument("--json", action="store_true",
                         help="with --once or --frames N: one JSON object per frame (figures per "
                              "server and model, the autoscaling load) instead of the table")
    threshold = monitor.add_argument(
        "--threshold-us", type=float, default=100_000.0, metavar="US",
        help="autoscaling threshold of queue time per execution, in microseconds like the "
             "table's queue column (SuperSONIC's default 100 ms: 100000)")
    add_deprecated_alias(monitor, "--threshold", threshold, convert=_ms_to_us)
    cache = monitor.add_argument(
        "--inference-cache", action="append", default=[], metavar="DIR",
        help="a persistent inference cache directory: hits, misses and bytes saved by every "
             "process that used it (repeatable)")
    add_deprecated_alias(monitor, "--cache", cache)
    monitor.add_argument("--shadow", action="append", default=[], metavar="DIR",
                         help="shadow validation's reports (the workers' COFFEA_SONIC_SHADOW_DIR): "
                              "rows compared, largest divergence and alarms per model, server and "
                              "output (repeatable)")
    monitor.set_defaults(func=run_monitor)


def _ms_to_us(milliseconds: float) -> float:
    return milliseconds * 1000.0


def servers(args: argparse.Namespace) -> list[str]:
    """The servers a command was given: every ``--server``, then the positional shortcuts.

    >>> servers(argparse.Namespace(servers=["a:8001"], urls=["b:8001"]))
    ['a:8001', 'b:8001']
    """
    return [*(getattr(args, "servers", None) or []), *(getattr(args, "urls", None) or [])]


def add_batch_options(parser: argparse.ArgumentParser) -> None:
    """``--queue/--account/--walltime/--memory`` of batch workers (slurm, htcondor); left out,
    the site's dask-jobqueue configuration (``jobqueue.yaml``) decides."""
    group = parser.add_argument_group(
        "batch workers (slurm, htcondor)",
        "left out: the site's dask-jobqueue configuration (jobqueue.yaml) decides")
    group.add_argument("--queue", metavar="NAME",
                       help="SLURM partition / HTCondor JobFlavour")
    group.add_argument("--account", metavar="NAME", help="SLURM account to charge")
    group.add_argument("--walltime", metavar="HH:MM:SS", help="run time limit of each worker job")
    group.add_argument("--memory", metavar="SIZE", help="memory of each worker job, e.g. 4GiB")


def batch_options(args: argparse.Namespace) -> dict[str, str]:
    """The :func:`add_batch_options` values that were given, as ``make_cluster`` keywords.

    >>> batch_options(argparse.Namespace(queue="short", account=None, walltime=None, memory="4GiB"))
    {'queue': 'short', 'memory': '4GiB'}
    """
    return {name: getattr(args, name) for name in ("queue", "account", "walltime", "memory")
            if getattr(args, name, None) is not None}


def run_check(args: argparse.Namespace) -> int:
    from ..errors import SonicError
    from .check import CheckOptions, check_on_workers, check_servers, render_reports

    options = CheckOptions(tls=args.tls, ca_file=args.ca_file, cert_file=args.cert_file,
                           key_file=args.key_file, server_name=args.server_name,
                           token_env=args.token_env, token_file=args.token_file,
                           timeout_s=args.timeout_s, pings=args.pings,
                           protocol_key_name=args.protocol_key_name,
                           protocol_key_env=args.protocol_key_env,
                           protocol_key_file=args.protocol_key_file, transport=args.transport)
    color = sys.stdout.isatty() and not args.no_color
    try:
        if args.on_workers:
            from .cluster import make_cluster

            forwarded = [name for name in (args.token_env, args.protocol_key_env) if name] or None
            with make_cluster(args.on_workers, workers=1, env=forwarded,
                              **batch_options(args)) as cluster:
                by_worker = check_on_workers(cluster.client, servers(args) or None, options)
            reports = [report for reports in by_worker.values() for report in reports]
        else:
            reports = check_servers(servers(args) or None, options)
    except SonicError as error:
        print(f"coffea-sonic check: {error}", file=sys.stderr)
        return 2
    ok = all(report.ok for report in reports)
    if args.json:
        print_json({"ok": ok, "servers": [{"ok": report.ok, **vars(report)} for report in reports]})
    else:
        print(render_reports(reports, color=color))
    return 0 if ok else 1


def run_monitor(args: argparse.Namespace) -> int:
    from ..errors import SonicError
    from .monitor import monitor

    if args.json and not (args.once or args.frames):
        print("coffea-sonic monitor: --json needs --once or --frames N (a live view is text)",
              file=sys.stderr)
        return 2
    try:
        return monitor(servers(args), interval_s=args.interval_s, once=args.once,
                       frames=args.frames, color=False if args.no_color else None,
                       threshold_ms=args.threshold_us / 1000.0, as_json=args.json,
                       cache_dirs=args.inference_cache, shadow_dirs=args.shadow)
    except SonicError as error:
        print(f"coffea-sonic monitor: {error}", file=sys.stderr)
        return 2
