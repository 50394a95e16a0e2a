"""The house rules the package's shape must keep (checked on the source, like tests/test_layers.py).

* glue stays generic: the zoo's column recipes live in the zoo, and a default the glue shares
  with a zoo model is the model's declaration.
"""

from __future__ import annotations

from coffea_sonic import columns
from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES


def test_jet_features_default_is_the_jet_taggers_input_order():
    assert columns.DEFAULT_JET_FIELDS == JET_TAGGER_FEATURES
