"""Benchmarks that need a CUDA GPU (most of them; some modes also run on a CPU box).

Each module runs as ``python -m coffea_sonic.bench.gpu.NAME`` (``--help`` lists its options)
and under its old path, ``python benchmarks/gpu/NAME.py``, which the scripts in benchmarks/gpu/
call after setting up the GPU machine (prologue.sh):

* :mod:`~coffea_sonic.bench.gpu.defaults_sweep`: served vs in-process throughput at the
  defaults, on one GPU and on every GPU (``--plan smoke --device cpu`` runs anywhere);
* :mod:`~coffea_sonic.bench.gpu.serve_check`: ``coffea-sonic serve`` end to end, engines compared
  (``--device cpu`` runs without a GPU);
* :mod:`~coffea_sonic.bench.gpu.shadow_tolerance`: served-vs-reference divergence per zoo model
  (``--device cpu`` runs without a GPU).

Probes whose only product was a recorded study left the package; benchmarks/studies/README.md
names them, their results and the commit that holds their code.

>>> from coffea_sonic.bench.gpu import MODULES
>>> "defaults_sweep" in MODULES
True
"""

from __future__ import annotations

#: the runnable modules (``python -m coffea_sonic.bench.gpu.NAME``)
MODULES = ("defaults_sweep", "serve_check", "shadow_tolerance")
