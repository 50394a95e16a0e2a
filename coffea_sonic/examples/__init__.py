"""Example analyses that use coffea-sonic (start with :mod:`coffea_sonic.examples.jet_tagging`)."""
