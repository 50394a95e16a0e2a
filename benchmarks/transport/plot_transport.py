"""Figure of RESULTS-transport.md from the JSON files next to it (no numbers typed in by hand).

    python benchmarks/transport/plot_transport.py      # writes transport-h100.png, transport-cpu.png
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def load(name: str) -> list[dict]:
    return [r for r in json.loads((HERE / name).read_text())["records"] if "rows_per_s" in r]


def pick(records: list[dict], **match) -> dict | None:
    for record in records:
        if all(record.get(key) == value for key, value in match.items()):
            return record
    return None


EMTRK = [
    ("before: stock client, 1 inst., 1 proc", 1, dict(phase="before", kind="tritonclient", procs=1)),
    ("before: stock client, 1 inst., 8 procs", 1, dict(phase="before", kind="tritonclient", procs=8)),
    ("before server + shm, 8 procs", 1, dict(phase="before", kind="shm", procs=8)),
    ("new model.py, 1 inst., shm 8", 1, dict(phase="after-i1", kind="shm", procs=8)),
    ("2 inst., shm 8", 1, dict(phase="after", kind="shm", procs=8)),
    ("2 inst., shm 12", 1, dict(phase="after", kind="shm", procs=12)),
    ("3 inst., shm 8 (run 2)", 2, dict(phase="after-i3", kind="shm", procs=8)),
    ("4 inst., shm 8 (run 1, TS fused)", 1, dict(phase="after-i4", kind="shm", procs=8)),
    ("4 inst., shm 12 (run 1, TS fused)", 1, dict(phase="after-i4", kind="shm", procs=12)),
    ("4 inst., shm 8 (run 2, TS unfused)", 2, dict(phase="after", kind="shm", procs=8)),
    ("4 inst., shm 16 (run 2)", 2, dict(phase="after", kind="shm", procs=16)),
    ("4 inst., pageable, shm 8 (run 2)", 2, dict(phase="after-pageable", kind="shm", procs=8)),
    ("4 inst., gRPC 8 (run 2)", 2, dict(phase="after", kind="grpc", procs=8)),
    ("4 inst., framed gRPC 8 (run 2)", 2, dict(phase="after", kind="grpc-framed", procs=8)),
    ("2 inst., GPU inputs, CUDA shm 4 (run 1)", 1, dict(phase="after-gpuin", kind="cuda", procs=4)),
    ("4 inst., GPU inputs, CUDA shm 8 (run 2)", 2, dict(phase="after-gpuin", kind="cuda", procs=8)),
]
JET = [
    ("before: stock client, 1 proc, 16k rows", 1, dict(phase="before", kind="tritonclient", procs=1)),
    ("before: stock client, 8 procs, 16k rows", 1, dict(phase="before", kind="tritonclient", procs=8)),
    ("before server + shm, 8 procs, 16k rows", 1, dict(phase="before", kind="shm", procs=8)),
    ("2 inst., shm 8, 16k rows", 1, dict(phase="after", kind="shm", procs=8, rows=16384)),
    ("2 inst., gRPC 8, 16k rows", 1, dict(phase="after", kind="grpc", procs=8, rows=16384)),
    ("2 inst., shm 12, 64k rows", 1, dict(phase="after", kind="shm", procs=12, rows=65536)),
    ("4 inst., shm 12, 64k rows (run 1)", 1, dict(phase="after-i4", kind="shm", procs=12)),
    ("4 inst., shm 12, 64k rows (run 2)", 2, dict(phase="after", kind="shm", procs=12)),
    ("4 inst., gRPC 12, 64k rows (run 2)", 2, dict(phase="after", kind="grpc", procs=12)),
]


def served_panel(axis, runs, model, wanted, goal, title):
    """Bars: served rows/s over in-process rows/s at the same request size (same run if it has it)."""
    labels, ratios, gpus = [], [], []
    for label, run, match in wanted:
        record = pick(runs[run], model=model, **match)
        if record is None:
            continue
        local = (pick(runs[run], kind="local", model=model, rows=record["rows"])
                 or pick(runs[1], kind="local", model=model, rows=record["rows"]))
        if local is None:
            continue
        labels.append(label)
        ratios.append(record["rows_per_s"] / local["rows_per_s"])
        gpus.append(record.get("gpu_util"))
    colors = ["#b0b0b0" if label.startswith("before") else "#3b75af" for label in labels]
    axis.barh(range(len(labels)), ratios, color=colors)
    for index, gpu in enumerate(gpus):
        if gpu is not None:
            axis.text(ratios[index] + 0.01, index, f"{ratios[index]:.2f}x, GPU {gpu:.0f}%",
                      va="center", fontsize=7)
    axis.axvline(1.0, color="black", lw=1)
    axis.axvline(goal, color="red", lw=1, ls="--")
    axis.set_yticks(range(len(labels)), labels, fontsize=7)
    axis.invert_yaxis()
    axis.set_xlabel("served / in-process torch incl. copies, same request size (dashed: target)")
    axis.set_title(title, fontsize=9)


def bandwidth_panel(axis, records, title):
    kinds = ["tritonclient", "grpc", "grpc-framed", "http", "shm"]
    sizes = sorted({r["rows"] for r in records if r["model"] == "payload_sink" and r["procs"] == 1})
    width = 0.8 / max(len(sizes), 1)
    for offset, size in enumerate(sizes):
        values = []
        for kind in kinds:
            candidates = [r for r in records if r["model"] == "payload_sink" and r["procs"] == 1
                          and r["kind"] == kind and r["rows"] == size]
            values.append(max((r["gb_per_s"] for r in candidates), default=0.0))
        axis.bar([i + offset * width for i in range(len(kinds))], values, width,
                 label=f"{size} rows ({size * 9216 / 1e6:.1f} MB)")
    axis.axhline(1.0, color="red", lw=1, ls="--")
    axis.axhline(5.0, color="red", lw=1, ls=":")
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(kinds))], kinds, fontsize=8)
    axis.set_ylabel("tensor payload GB/s, one client process")
    axis.legend(fontsize=7)
    axis.set_title(title, fontsize=9)


def main() -> None:
    runs = {1: load("results-h100-run1.json"), 2: load("results-h100-run2.json")}
    figure, axes = plt.subplots(1, 3, figsize=(19, 6.5))
    served_panel(axes[0], runs, "emtrk_cnn", EMTRK, 0.9, "emtrk_cnn, 2048 rows/request (H100)")
    served_panel(axes[1], runs, "jet_tagger", JET, 0.5, "jet_tagger (H100)")
    bandwidth_panel(axes[2], runs[1] + runs[2], "payload_sink: one client process (H100, best of runs)")
    figure.tight_layout()
    figure.savefig(HERE / "transport-h100.png", dpi=100)
    cpu = load("results-cpu.json")
    figure, axis = plt.subplots(figsize=(7, 5))
    bandwidth_panel(axis, cpu, "payload_sink: one process (2-core CPU box, server on the same cores)")
    figure.tight_layout()
    figure.savefig(HERE / "transport-cpu.png", dpi=100)


if __name__ == "__main__":
    main()
