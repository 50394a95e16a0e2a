"""Training of the zoo's shipped models: a developer tool, not part of the installed package.

The package ships the trained files (``coffea_sonic/zoo/*.onnx``, ``trackgnn.npz``,
``agc_bdt_*.json``) and serves them; this folder holds the code that made them, so that a
retraining can be checked against the committed files (``tests/test_jet_tagger_training.py``,
``tests/test_zoo_physics.py``, ``tests/test_trackgnn.py``, ``tests/test_agc.py``). Run from
``scripts/`` (the tests put it on ``sys.path``):

* ``python -m zoo_training.export [NAME ...]``: re-export the shipped ONNX files
  (``jet_tagger`` by :mod:`.train`, ``particlenet`` and ``deepmet`` by :mod:`.physics`);
* ``python -m zoo_training.trackgnn_train``: ``trackgnn.npz``;
* ``python -m zoo_training.train_agc_bdt``: the AGC BDT pair.
"""
