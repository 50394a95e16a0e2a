"""Data for coffea-sonic: NanoAOD branch declarations, synthetic samples (imported lazily; the
datasets: docs/internals/examples.md, with an example).
"""

from __future__ import annotations

from ..lazy import lazy_exports

# public name -> module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    "TREE_NAME": ".nanoaod",
    "DATASETS": ".synthetic", "dataset_tools_fileset": ".synthetic", "draw_jets": ".synthetic",
    "draw_labelled_jets": ".synthetic", "generate_events": ".synthetic",
    "write_sample": ".synthetic",
    "generate_hits": ".hits", "hit_collection": ".hits", "hit_rows": ".hits", "hit_xyz": ".hits",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
