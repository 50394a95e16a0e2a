"""Data for coffea-sonic: NanoAOD branch declarations, synthetic samples, real CMS test files.

>>> from coffea_sonic import data
>>> data.DATASETS
('ttbar', 'qcd_light')
"""

from __future__ import annotations

from .nanoaod import TREE_NAME
from .real import REAL_SAMPLE_NAMES, fetch_coffea_test_samples
from .synthetic import (DATASETS, dataset_tools_fileset, draw_jets, draw_labelled_jets,
                        generate_events, write_sample)

__all__ = [
    "DATASETS", "REAL_SAMPLE_NAMES", "TREE_NAME", "dataset_tools_fileset", "draw_jets",
    "draw_labelled_jets", "fetch_coffea_test_samples", "generate_events", "write_sample",
]
