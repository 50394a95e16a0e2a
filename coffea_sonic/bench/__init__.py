"""Benchmarks: in-process CPU / GPU vs our Triton client vs coffea's triton_wrapper, and scaling.
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "BenchConfig": "coffea_sonic.bench.config",
    "MODES": "coffea_sonic.bench.config",
    "ScalingModel": "coffea_sonic.bench.scaling",
    "ScalingFit": "coffea_sonic.bench.scaling",
    "fit_scaling_model": "coffea_sonic.bench.scaling",
    "machine_info": "coffea_sonic.bench.machine",
    "run_bench": "coffea_sonic.bench.suite",
    "write_outputs": "coffea_sonic.bench.report",
    "markdown_report": "coffea_sonic.bench.report",
    "run_end_to_end": "coffea_sonic.bench.e2e",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
