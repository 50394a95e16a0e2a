"""Benchmarks that need a CUDA GPU (most of them; some modes also run on a CPU box).
Design notes and examples: docs/internals/bench.md."""

from __future__ import annotations

#: the runnable modules (``python -m coffea_sonic.bench.gpu.NAME``)
MODULES = ("defaults_sweep",)
