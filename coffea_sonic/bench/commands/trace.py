"""``coffea-sonic bench trace``: where a light user's latency goes in the fairness scenario.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

import argparse
import bisect
import collections
import glob
import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import progress_printer, scenario_parser

__all__ = ["COMPONENTS", "analyse", "components", "register", "run_traced"]

_DESCRIPTION = """\
Runs coffea-sonic bench fairness --quick with Triton's request trace on and per-process CPU
sampling, then splits every light request's latency into to_server (until the server has read
it), queue, compute, send and back (until the caller has the answer), solo and contended, and
gives cores used / threads waiting (schedstat) per phase and process group. One run at a time.

examples:
  coffea-sonic bench trace -o /tmp/fairness-trace --set rows=2048
  coffea-sonic bench trace --analyse /tmp/fairness-trace     # analyse an earlier run again
"""


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``trace`` to the ``bench`` scenarios."""
    parser = scenario_parser(subparsers, "trace", run=run, description=_DESCRIPTION,
                             help="the fairness scenario traced: where a light request's time goes")
    parser.add_argument("--analyse", metavar="DIR",
                        help="only analyse a folder an earlier run wrote (no run)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="FairnessConfig fields (JSON values), e.g. rows=2048 heavy_nice=0")
    return parser


def _overrides(items: list[str]) -> dict:
    return {key: json.loads(value) for key, value in (item.split("=", 1) for item in items)}


def run(args: argparse.Namespace) -> int:
    """Run (unless ``--analyse``), then print the analysis."""
    folder = Path(args.analyse or args.output)
    if not args.analyse:
        for line in run_traced(folder, _overrides(args.set), progress_printer()):
            print(line)
    print("\n".join(analyse(folder)))
    return 0


COMPONENTS = ("to_server", "queue", "compute", "send", "back")
IDS_PER_USER = 10**7


def traced_user_task(task: dict, tasks: Any, control: Any, cache: dict) -> dict:
    """:func:`coffea_sonic.bench.fairness.user_task` in a process whose request ids start at
    ``index * IDS_PER_USER`` and whose pid file names its user."""
    from ... import dispatch
    from ..fairness import user_task

    if "traced" not in cache:
        cache["traced"] = Path(os.environ["FAIRNESS_TRACE_DIR"], "pids")
        cache["traced"].mkdir(exist_ok=True)
        (cache["traced"] / str(os.getpid())).write_text(str(task["index"]))
        # request ids are "<call id>.<piece>"; the call counter lives where calls are made
        dispatch._call_ids = itertools.count(task["index"] * IDS_PER_USER + 1)  # type: ignore
    return user_task(task, tasks, control, cache)


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            parent = int(Path(stat).read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.split("/")[2]))
    todo, seen = [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += children.get(pid, [])
    return seen


def _sample(samples: list, stop: threading.Event) -> None:
    """Every 0.25 s: per process (this one and its descendants) CPU and run-queue wait (ns)."""
    while not stop.is_set():
        row = {}
        for pid in _tree(os.getpid()):
            run = wait = 0
            for task in glob.glob(f"/proc/{pid}/task/*/schedstat"):
                try:
                    used, waited, _ = Path(task).read_text().split()
                except (OSError, ValueError):
                    continue
                run, wait = run + int(used), wait + int(waited)
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            row[pid] = (name, run, wait)
        total = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        samples.append((time.monotonic(), row, total))
        stop.wait(0.25)


def run_traced(output: Path, overrides: dict[str, Any],
               progress: Callable[[str], None] | None = None) -> list[str]:
    """The quick fairness scenario (``overrides``: FairnessConfig fields) with Triton's trace on
    and CPU sampling; writes results.json, trace.json, records.json, samples.json and the users'
    pid files into ``output``; returns the scenario's summary lines."""
    import dataclasses

    from .. import fairness
    from ..files import write_json
    from .fairness import summary_lines

    output.mkdir(parents=True, exist_ok=True)
    os.environ["FAIRNESS_TRACE_DIR"] = str(output)
    server_args = ["--trace-config", f"triton,file={output / 'trace.json'}",
                   "--trace-config", "triton,log-frequency=0",
                   "--trace-config", "rate=1", "--trace-config", "level=TIMESTAMPS"]

    def keep(phases: list, records: dict) -> None:
        (output / "records.json").write_text(json.dumps(
            {"phases": [dataclasses.asdict(p) for p in phases], "records": records}))

    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(samples, stop), daemon=True)
    sampler.start()
    try:
        results = fairness.run_fairness(fairness.config_for("quick", **overrides),
                                        progress=progress, server_args=server_args,
                                        user_task=traced_user_task, on_records=keep)
    finally:
        stop.set()
        sampler.join()
    write_json(results, output, "results.json")
    (output / "samples.json").write_text(json.dumps(samples))
    return summary_lines(results)


def _traces(path: Path) -> dict[int, list[dict[str, float]]]:
    """Completed trace entries by user, sorted by the time the server read the request."""
    entries: dict[int, dict[str, Any]] = collections.defaultdict(dict)
    for event in json.loads(path.read_text()):
        if "request_id" in event:
            entries[event["id"]]["rid"] = event["request_id"]
        for stamp in event.get("timestamps", []):
            entries[event["id"]][stamp["name"]] = stamp["ns"] / 1e9
    by_user: dict[int, list] = collections.defaultdict(list)
    for entry in entries.values():
        if "COMPUTE_START" in entry and "GRPC_WAITREAD_END" in entry and "rid" in entry:
            by_user[int(entry["rid"].split(".")[0]) // IDS_PER_USER].append(entry)
    for entries_of_user in by_user.values():
        entries_of_user.sort(key=lambda entry: entry["GRPC_WAITREAD_END"])
    return by_user


def components(by_user: dict, user: int, sent: float, done: float) -> dict[str, float] | None:
    """The answered attempt of the request sent at ``sent`` and answered at ``done``."""
    entries = by_user[user]
    first = bisect.bisect_left([entry["GRPC_WAITREAD_END"] for entry in entries], sent - 1e-4)
    inside = [entry for entry in entries[first:first + 40] if entry["GRPC_SEND_END"] <= done + 1e-4]
    if not inside:
        return None
    entry = min(inside, key=lambda entry: abs(entry["GRPC_SEND_END"] - done))
    return {"total": done - sent, "to_server": entry["QUEUE_START"] - sent,
            "queue": entry["COMPUTE_START"] - entry["QUEUE_START"],
            "compute": entry["COMPUTE_END"] - entry["COMPUTE_START"],
            "send": entry["GRPC_SEND_END"] - min(entry["GRPC_SEND_START"], entry["COMPUTE_END"]),
            "back": done - entry["GRPC_SEND_END"]}


def analyse(output: Path) -> list[str]:
    """Per component of a light request's latency (solo and contended) and CPU per phase."""
    lines: list[str] = []
    saved = json.loads((output / "records.json").read_text())
    config = json.loads((output / "results.json").read_text())["config"]
    settle, by_user = config["settle_s"], _traces(output / "trace.json")
    for kind, users in (("solo", ["1"]), ("contended", list(map(str, range(1, config["users"]))))):
        rows = []
        for phase in saved["phases"]:
            if phase["name"].split("-")[0] != kind:
                continue
            low, high = phase["start_at"] + settle, phase["start_at"] + phase["duration_s"]
            for user in users:
                for sent, done, _, good, _ in saved["records"][phase["name"]][user]["records"]:
                    if good and low <= sent < high:
                        parts = components(by_user, int(user), sent, done)
                        rows += [parts] if parts else []
        total = np.array([row["total"] for row in rows]) * 1e3
        p95 = np.percentile(total, 95)
        tail = [row for row in rows if row["total"] * 1e3 >= p95]
        lines.append(f"{kind} light requests: {len(rows)}, p50 {np.percentile(total, 50):.2f} "
                     f"ms, p95 {p95:.2f} ms; per component (ms): mean, p95, mean over the "
                     f"requests >= p95")
        for name in COMPONENTS:
            values = np.array([row[name] for row in rows]) * 1e3
            lines.append(f"  {name:10s} {values.mean():7.2f} {np.percentile(values, 95):7.2f} "
                         f"{np.mean([row[name] for row in tail]) * 1e3:7.2f}")
    return lines + _cpu(output, saved["phases"], settle)


def _cpu(output: Path, phases: list, settle: float) -> list[str]:
    samples = json.loads((output / "samples.json").read_text())
    users = {pid.name: int(pid.read_text()) for pid in (output / "pids").iterdir()}

    def group(pid: str, name: str) -> str:
        user = users.get(pid)
        return name if user is None else ("heavy user" if user == 0 else "light users")

    def at(moment: float) -> list:
        return min(samples, key=lambda sample: abs(sample[0] - moment))

    lines = ["per phase: machine cores busy (all processes); per group: cores used / threads "
             "waiting"]
    for phase in phases:
        # threads that end with the phase take their counters along: stop just before
        first = at(phase["start_at"] + settle)
        last = at(phase["start_at"] + phase["duration_s"] - 0.4)
        seconds = last[0] - first[0]
        ticks = [b - a for a, b in zip(first[2], last[2])]
        busy = 2 * (1 - (ticks[3] + ticks[4]) / max(1, sum(ticks)))
        groups: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
        for pid, (name, used, waited) in last[1].items():
            if pid in first[1]:
                groups[group(pid, name)][0] += (used - first[1][pid][1]) / 1e9 / seconds
                groups[group(pid, name)][1] += (waited - first[1][pid][2]) / 1e9 / seconds
        lines.append(f"  {phase['name']:12s} busy {busy:.2f}  " + "  ".join(
            f"{name} {used:.2f}/{waited:.2f}" for name, (used, waited)
            in sorted(groups.items(), key=lambda item: -item[1][0]) if used > 0.01))
    return lines
