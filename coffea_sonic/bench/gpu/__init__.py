"""Benchmarks that need a CUDA GPU (most of them; some modes also run on a CPU box).
Design notes: docs/internals/bench.md.

>>> from coffea_sonic.bench.gpu import MODULES
>>> "defaults_sweep" in MODULES
True
"""

from __future__ import annotations

#: the runnable modules (``python -m coffea_sonic.bench.gpu.NAME``)
MODULES = ("defaults_sweep",)
