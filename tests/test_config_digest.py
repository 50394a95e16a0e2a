"""``ModelInfo.checksum`` covers the served config's parts that change answers: a model whose
ONNX graph optimisation level or label file differs gets another checksum (so ``expected_checksum``
refuses it and provenance tells the two apart), while instance counts and batching do not."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.errors import SonicError
from coffea_sonic.server import LocalTritonServer
from experiment_repository import experiment_repository

pytest.importorskip("torch")  # the repository's models are exported by torch


def _variant(source, target, old: str, new: str):
    shutil.copytree(source, target)
    config = target / "mass_reg" / "config.pbtxt"
    text = config.read_text()
    assert old in text, text
    config.write_text(text.replace(old, new))
    return target


def test_checksum_follows_what_changes_answers_not_how_the_model_is_run(tmp_path):
    base = experiment_repository(tmp_path / "base")
    for name in ("pnet_onnx", "pnet_ts"):  # one small model is enough here
        shutil.rmtree(base / name)
    instances = _variant(base, tmp_path / "instances", "kind: KIND_CPU count: 1 } ]",
                         "kind: KIND_CPU count: 2 } ]\ndynamic_batching { }")
    level = _variant(base, tmp_path / "level", "graph { level: 0 }", "graph { level: 1 }")
    labels = _variant(base, tmp_path / "labels", 'label_filename: "labels.txt" ', "")
    features = np.random.default_rng(1).normal(size=(20, 6)).astype(np.float32)
    checksums, answers = {}, {}
    for name, repository in (("base", base), ("instances", instances), ("level", level),
                             ("labels", labels)):
        with LocalTritonServer(repository=repository, device="cpu").start() as server:
            model = TritonModel(server.url("mass_reg"), fallback="off")
            try:
                answers[name] = model({"features": features})["mass"]
                checksums[name] = model.info.checksum
                if name == "level":
                    pinned = TritonModel(server.url("mass_reg"), fallback="off",
                                         expected_checksum=checksums["base"])
                    with pytest.raises(SonicError, match=checksums["level"]):
                        pinned({"features": features})
            finally:
                model.close()
    assert checksums["instances"] == checksums["base"]
    assert len({checksums["base"], checksums["level"], checksums["labels"]}) == 3
    for name in ("instances", "level", "labels"):  # same weights: the checksum is the config's
        np.testing.assert_allclose(answers[name], answers["base"], atol=1e-5)
