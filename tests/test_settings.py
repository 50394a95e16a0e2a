"""Every setting has one name and one order of sources; ``coffea-sonic config`` says which won.

Order: argument > environment (COFFEA_SONIC_<NAME>) > Dask config (coffea_sonic.<name>) >
endpoints file > default; model endpoints put the URL declared in code last. Each level is set
for real (a variable, ``dask.config.set``, a TOML file named by COFFEA_SONIC_CONFIG) and the
consumer (TritonModel, model_urls) is asked, not only the resolver.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dask.config
import pytest

from coffea_sonic import TritonModel
from coffea_sonic.config import (SETTINGS, configured_servers, effective_settings, model_urls,
                                 resolve, resolve_model, spec)
from coffea_sonic.errors import ConfigurationError

PACKAGE = Path(__file__).resolve().parents[1] / "coffea_sonic"
SETTINGS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "facility" / "settings.md"
DECLARED = "triton+grpc://localhost:8001/jet_tagger/2"


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No COFFEA_SONIC_* variable, no coffea_sonic Dask config, an endpoints file of our own."""
    for name in list(os.environ):
        if name.startswith(("COFFEA_SONIC_", "DASK_COFFEA_SONIC")):
            monkeypatch.delenv(name)
    endpoints = tmp_path / "endpoints.toml"
    monkeypatch.setenv("COFFEA_SONIC_CONFIG", str(endpoints))
    endpoints.write_text("")
    with dask.config.set({"coffea_sonic": {}}):
        yield endpoints


def test_each_source_beats_the_ones_below_it_and_the_model_sees_the_winner(clean, monkeypatch):
    url = "triton+grpc://127.0.0.1:1/jet_tagger"
    assert (resolve("transport").source, TritonModel(url).transport) == ("default", "auto")
    clean.write_text('transport = "http"\n')
    assert (resolve("transport").source, TritonModel(url).transport) == ("endpoints file", "http")
    assert resolve("transport").where == str(clean)
    with dask.config.set({"coffea_sonic.transport": "shm"}):
        assert resolve("transport").where == "coffea_sonic.transport"
        assert TritonModel(url).transport == "shm"
        monkeypatch.setenv("COFFEA_SONIC_TRANSPORT", "grpc")
        assert (resolve("transport").source, TritonModel(url).transport) == ("environment", "grpc")
        assert resolve("transport", "http").source == "argument"
        assert TritonModel(url, transport="http").transport == "http"


def test_model_endpoints_put_the_declared_url_last(clean, monkeypatch):
    assert resolve_model("jet_tagger", DECLARED).source == "argument"
    clean.write_text('servers = ["gpu9:8001"]\n')
    assert model_urls("jet_tagger", DECLARED) == ["triton+grpc://gpu9:8001/jet_tagger/2"]
    assert resolve_model("jet_tagger", DECLARED).source == "endpoints file"
    clean.write_text('servers = ["gpu9:8001"]\n[models]\njet_tagger = ["triton+grpc://f:1/jet_tagger"]\n')
    assert model_urls("jet_tagger", DECLARED) == ["triton+grpc://f:1/jet_tagger"]
    with dask.config.set({"coffea_sonic.models.jet_tagger": ["triton+grpc://d:1/jet_tagger"]}):
        assert resolve_model("jet_tagger", DECLARED).where == "coffea_sonic.models.jet_tagger"
        monkeypatch.setenv("COFFEA_SONIC_MODEL_JET_TAGGER", "triton+grpc://e:1/jet_tagger")
        resolved = resolve_model("jet_tagger", DECLARED)
        assert (resolved.value, resolved.source) == (["triton+grpc://e:1/jet_tagger"], "environment")
    monkeypatch.delenv("COFFEA_SONIC_MODEL_JET_TAGGER")
    monkeypatch.setenv("COFFEA_SONIC_SERVERS", "gpu1:8001")
    assert configured_servers() == ["gpu1:8001"]
    assert resolve_model("other", DECLARED.replace("jet_tagger", "other")).where == \
        "servers (COFFEA_SONIC_SERVERS) in the declared URL"


def test_every_setting_the_package_reads_is_documented():
    """A literal setting("x") anywhere in the package names a setting of SETTINGS, and no module
    reads a COFFEA_SONIC_ variable around the settings (except per-model endpoints)."""
    names = {entry.name for entry in SETTINGS}
    read, direct = set(), []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", None)) == "setting" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                read.add(node.args[0].value)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    re.fullmatch(r"COFFEA_SONIC_[A-Z0-9_]*", node.value):
                direct.append((path.name, node.value))
    assert read - {"no_such_setting"} <= names, (
        f"settings read but not documented: {sorted(read - names)}; add them to SETTINGS in "
        "coffea_sonic/core/settings.py (docs/facility/settings.md shows its table)")
    documented = {entry.env for entry in SETTINGS}
    undocumented = [(where, name) for where, name in direct if name not in documented
                    and not name.startswith("COFFEA_SONIC_MODEL_") and name != "COFFEA_SONIC_"]
    assert not undocumented, (
        f"variables read but not documented: {undocumented}; add them to SETTINGS in "
        "coffea_sonic/core/settings.py (sources=_ENV_ONLY if read from the environment only); "
        "docs/facility/settings.md shows its table")


def test_documented_defaults_are_the_ones_the_code_uses(clean, monkeypatch):
    from coffea_sonic import zoo
    from coffea_sonic.cache.disk import DEFAULT_MAX_BYTES

    monkeypatch.delenv("COFFEA_SONIC_CONFIG")
    values = {entry.name: entry for entry in effective_settings()}
    assert all(entry.source == "default" for entry in values.values()), values
    assert values["cache"].value == str(zoo.cache_dir())
    assert values["inference_cache_size"].value == DEFAULT_MAX_BYTES
    assert values["transport"].value == TritonModel("triton+grpc://h:1/m").transport
    assert values["config"].value.endswith("coffea-sonic/endpoints.toml")


def test_unknown_setting_names_the_known_ones():
    with pytest.raises(ConfigurationError, match="transport"):
        spec("transprot")
    with pytest.raises(ConfigurationError, match="no setting named 'transprot'"):
        effective_settings({"transprot": "grpc"})


def test_settings_page_shows_the_table_of_every_setting_each_saying_what_it_does():
    # the page's table is generated from SETTINGS (docs/_ext/sonic_docs.py); tests/test_docs.py
    # checks the built page lists every variable
    assert ".. sonic-settings-table::" in SETTINGS_PAGE.read_text()
    unexplained = [entry.name for entry in SETTINGS if len(entry.help.split()) < 3]
    assert not unexplained, f"settings without a description for the docs' table: {unexplained}"
    assert len({entry.env for entry in SETTINGS}) == len(SETTINGS), "one variable per setting"


def test_config_command_shows_every_source(clean, tmp_path):
    clean.write_text('fallback = "cpu"\nservers = ["gpu5:8001"]\n')
    site = tmp_path / "dask"
    site.mkdir()
    (site / "coffea_sonic.yaml").write_text("coffea_sonic:\n  token_file: /home/u/sonic.token\n")
    env = {**os.environ, "COFFEA_SONIC_TRANSPORT": "grpc", "DASK_CONFIG": str(site)}
    command = [sys.executable, "-m", "coffea_sonic.cli", "config", "--set", "ca_file=/ca.pem",
               "--model", "jet_tagger=" + DECLARED]
    completed = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    document = json.loads(completed.stdout)
    got = {entry["name"]: (entry["value"], entry["source"]) for entry in document["settings"]}
    assert got["ca_file"] == ("/ca.pem", "argument")
    assert got["transport"] == ("grpc", "environment")
    assert got["token_file"] == ("/home/u/sonic.token", "dask config")
    assert got["fallback"] == ("cpu", "endpoints file")
    assert got["protocol_key_env"] == (None, "default")
    assert {entry["name"] for entry in document["settings"]} == {entry.name for entry in SETTINGS}
    (model,) = document["models"]
    assert model["value"] == ["triton+grpc://gpu5:8001/jet_tagger/2"]
    assert model["source"] == "endpoints file"
    assert document["order"] == ["argument", "environment", "dask config", "endpoints file",
                                 "default"]
    assert document["endpoints_file"] == {"path": str(clean), "exists": True}
    text = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120).stdout
    line = next(row for row in text.splitlines() if row.startswith("transport "))
    assert line.split()[1:] == ["grpc", "environment", "COFFEA_SONIC_TRANSPORT"]
    assert f"endpoints file: {clean} (found)" in text
