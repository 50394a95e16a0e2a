"""Real CMS NanoAOD (from the coffea sdist on PyPI) through coffea NanoEvents and our columns."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import awkward as ak
import numpy as np
import onnxruntime
import pytest
from coffea.nanoevents import NanoAODSchema, NanoEventsFactory

from coffea_sonic import zoo
from coffea_sonic.columns import jagged_counts, jet_features, unflatten
from real_samples import REAL_SAMPLE_NAMES, fetch_coffea_test_samples
from coffea_sonic.errors import InputValidationError, MissingDependencyError
from coffea_sonic.zoo.spec import JET_TAGGER_FEATURES

pytestmark = [pytest.mark.filterwarnings("ignore:Missing cross-reference"),
              pytest.mark.filterwarnings("ignore:Branch .* already exists")]

#: Shared across test runs (and with other helpers' tests), so pip downloads the sdist once.
CACHE_DIR = Path(os.environ.get("COFFEA_SONIC_REAL_NANOAOD_DIR")
                 or Path(__file__).resolve().parents[1] / ".cache" / "real-nanoaod")


@pytest.fixture(scope="session")
def real_nanoaod() -> dict[str, Path]:
    return fetch_coffea_test_samples(CACHE_DIR)


def open_events(path):
    return NanoEventsFactory.from_root({str(path): "Events"}, schemaclass=NanoAODSchema,
                                       mode="virtual").events()


def test_fetch_provides_the_three_real_files(real_nanoaod):
    assert sorted(real_nanoaod) == sorted(REAL_SAMPLE_NAMES)
    assert all(path.is_file() and path.suffix == ".root" for path in real_nanoaod.values())


def test_fetch_reuses_cached_files_without_pip(real_nanoaod, monkeypatch):
    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the files are cached")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch_coffea_test_samples(CACHE_DIR) == real_nanoaod


def test_failed_download_raises_an_actionable_error(tmp_path, monkeypatch):
    def failing_pip(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(subprocess, "run", failing_pip)
    with pytest.raises(MissingDependencyError,
                       match=r"(?s)tests/samples/ into .*nowhere.*No matching distribution"):
        fetch_coffea_test_samples(tmp_path / "nowhere")


def test_real_dy_jet_features_have_the_right_shape_and_values(real_nanoaod):
    events = open_events(real_nanoaod["nano_dy"])
    assert len(events) == 40
    rows = jet_features(events.Jet)
    n_jets = int(ak.sum(ak.num(events.Jet)))
    assert n_jets > 40 and rows.shape == (n_jets, len(JET_TAGGER_FEATURES))
    assert rows.dtype == np.float32 and np.all(np.isfinite(rows))
    assert np.array_equal(rows[:, 0], ak.to_numpy(ak.flatten(events.Jet.pt)))
    flavour = jet_features(events.Jet, ["hadronFlavour"])[:, 0]
    assert set(np.unique(flavour)) <= {0.0, 4.0, 5.0}


def test_real_data_lacks_hadron_flavour_and_the_error_names_the_branch(real_nanoaod):
    jets = open_events(real_nanoaod["nano_dimuon"]).Jet
    assert "hadronFlavour" not in jets.fields
    with pytest.raises(InputValidationError, match="Jet_hadronFlavour"):
        jet_features(jets, [*JET_TAGGER_FEATURES, "hadronFlavour"])
    rows = jet_features(jets, [*JET_TAGGER_FEATURES, "hadronFlavour"],
                        defaults={"hadronFlavour": 0})
    assert rows.shape == (int(ak.sum(ak.num(jets))), len(JET_TAGGER_FEATURES) + 1)
    assert not rows[:, -1].any()


def test_real_empty_file_gives_empty_features(real_nanoaod):
    events = open_events(real_nanoaod["nano_dy_empty"])
    assert len(events) == 0
    rows = jet_features(events.Jet)
    assert rows.shape == (0, len(JET_TAGGER_FEATURES)) and rows.dtype == np.float32
    assert len(unflatten(np.zeros((0, 3), np.float32), jagged_counts(events.Jet))) == 0


def test_shipped_tagger_scores_real_jets_aligned_with_events(real_nanoaod):
    events = open_events(real_nanoaod["nano_dy"])
    session = onnxruntime.InferenceSession(str(zoo.onnx_path("jet_tagger")),
                                           providers=["CPUExecutionProvider"])
    probs = session.run(["probs"], {"features": jet_features(events.Jet)})[0]
    per_jet = unflatten(probs, jagged_counts(events.Jet))
    assert ak.all(ak.num(per_jet) == ak.num(events.Jet))
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
