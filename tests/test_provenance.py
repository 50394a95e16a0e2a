"""Provenance on the real path: a coffea run over real Dask workers whose chunks are answered by two
servers holding different versions of one model (two sites mid rolling update) warns by default,
fails with ``sonic_require_consistent_versions``, and its output names both versions, their servers,
config digests and row counts."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import urllib.request

import awkward as ak
import pytest
from coffea import processor
from coffea.nanoevents import NanoAODSchema

from coffea_sonic import SonicMixin, columns
from coffea_sonic.data.synthetic import write_sample
from coffea_sonic.provenance import Provenance
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.pipelines import write_models
from coffea_sonic.server.repository import config_text, parse_config

QuietSchema = type("QuietSchema", (NanoAODSchema,), {"warn_missing_crossrefs": False})


class TwoSites(SonicMixin, processor.ProcessorABC):
    """Each dataset's jets go to its own site's ``jet_tagger``."""

    def __init__(self, site_a: str, site_b: str, strict: bool) -> None:
        self.sonic_configure({"ttbar": site_a, "qcd_light": site_b})
        self.sonic_require_consistent_versions = strict

    def process(self, events):
        jets = events.Jet
        self.infer(events.metadata["dataset"], {"features": columns.jet_features(jets)}, like=jets)
        return {"jets": {events.metadata["dataset"]: int(ak.sum(ak.num(jets)))},
                "provenance": self.sonic_provenance()}

    def postprocess(self, accumulator):
        return accumulator


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """Site A serves jet_tagger v1 as the zoo writes it; site B v2 with a label file (a served
    config part that changes answers, so its config digest differs too)."""
    root = tmp_path_factory.mktemp("versions")
    repository = write_models(root / "v2", ["jet_tagger"])
    shutil.move(repository / "jet_tagger" / "1", repository / "jet_tagger" / "2")
    config = parse_config(repository / "jet_tagger" / "config.pbtxt")
    config.output[0].label_filename = "labels.txt"
    (repository / "jet_tagger" / "config.pbtxt").write_text(config_text(config))
    (repository / "jet_tagger" / "labels.txt").write_text("b\nc\nlight\n")
    with LocalTritonServer(models=["jet_tagger"], device="cpu").start() as first, \
            LocalTritonServer(repository=repository, device="cpu").start() as second:
        yield first, second, write_sample(root / "sample", events=1200, files=2, seed=4)


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def _sha16(document: dict) -> str:
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:16]


def served_config_digest(server: LocalTritonServer, model: str) -> str:
    """The config digest of ``model`` as documented (``signature_checksum`` and
    ``answering_digest``), computed here from the config the server hands out over HTTP: the
    signature (backend, max_batch_size, tensors), and the parts that change answers."""
    with urllib.request.urlopen(f"http://{server.http_address}/v2/models/{model}/config",
                                timeout=30) as response:
        config = json.loads(response.read())
    # parts of the recipe these configs do not use: were they set, the recipe here would miss them
    assert not {"graph", "execution_accelerators"} & set(config["optimization"])
    assert not config["batch_input"] and not config["batch_output"]
    assert "ensemble_scheduling" not in config
    answering = {}
    labels = {output["name"]: output["label_filename"] for output in config["output"]
              if output.get("label_filename")}
    if labels:
        answering["labels"] = labels
    if config.get("default_model_filename"):
        answering["file"] = config["default_model_filename"]

    def tensors(entries):
        return [[entry["name"], entry["data_type"].removeprefix("TYPE_"),
                 [int(dim) for dim in entry["dims"]]] for entry in entries]

    signature = {"platform": config["backend"] or config["platform"],
                 "max_batch_size": int(config["max_batch_size"]),
                 "inputs": tensors(config["input"]), "outputs": tensors(config["output"])}
    if answering:
        signature["answering"] = _sha16(answering)
    return _sha16(signature)


def _run(two_versions, client, strict: bool):
    first, second, fileset = two_versions
    # retries=0: coffea's default (3) would rerun a failing chunk and hide the first failure
    runner = processor.Runner(executor=processor.DaskExecutor(client=client, status=False,
                                                              retries=0),
                              schema=QuietSchema, chunksize=400)
    assert runner.retries == 0
    return runner({name: {"files": {path: "Events" for path in files}}
                   for name, files in fileset.items()}, treename="Events",
                  processor_instance=TwoSites(first.url("jet_tagger"), second.url("jet_tagger"),
                                              strict))


def test_two_versions_warn_and_the_output_names_both_with_their_rows(two_versions, dask_client,
                                                                     caplog):
    first, second, _ = two_versions
    with caplog.at_level(logging.WARNING, logger="coffea_sonic.provenance"):
        output = _run(two_versions, dask_client, strict=False)
    record: Provenance = output["provenance"]
    assert record.versions("jet_tagger") == ["1", "2"]
    rows = {(source, version): count for (model, source, version, _), count in record.rows().items()}
    assert rows == {(first.grpc_address, "1"): output["jets"]["ttbar"],
                    (second.grpc_address, "2"): output["jets"]["qcd_light"]}
    # each row's digest is the one of the config its server serves (the one expected_checksum
    # pins), which differs between the sites: site B's label file changes answers
    digests = {source: digest for (_, source, _, digest) in record.rows()}
    expected = {server.grpc_address: served_config_digest(server, "jet_tagger")
                for server in (first, second)}
    assert digests == expected
    assert expected[first.grpc_address] != expected[second.grpc_address]
    assert record.fallback_share("jet_tagger") == 0.0
    assert any("answered by 2 versions" in r.getMessage() and "version 1" in r.getMessage()
               for r in caplog.records)
    assert any(first.grpc_address in line and "v2" in line for line in record.describe())


def test_require_consistent_versions_fails_the_run(two_versions, dask_client):
    with pytest.raises(Exception, match="answered by 2 versions"):
        _run(two_versions, dask_client, strict=True)


class OneModel(SonicMixin):
    """SonicMixin outside coffea: the provenance of one chunk's calls."""

    def __init__(self, url: str) -> None:
        self.sonic_configure({"tagger": url}, fallback="cpu", timeout_s=20,
                             retry={"max_attempts": 1, "total_s": 2.0})


def test_the_record_gives_the_fallback_its_share_when_the_server_goes_away():
    from coffea_sonic import zoo
    from coffea_sonic.provenance import FALLBACK_SOURCE

    features = zoo.example_inputs("jet_tagger", 300, seed=2)
    server = LocalTritonServer(models=["jet_tagger"], device="cpu").start()
    try:
        processor_ = OneModel(server.url("jet_tagger"))
        processor_.sonic_model("tagger")(features)
        digest = served_config_digest(server, "jet_tagger")
    finally:
        server.stop()
    processor_.sonic_model("tagger")({"features": features["features"][:100]})
    record = processor_.sonic_provenance()
    rows = {source: count for (_, source, _, _), count in record.rows().items()}
    assert rows == {server.grpc_address: 300, FALLBACK_SOURCE: 100}
    assert record.fallback_share("jet_tagger") == 0.25
    assert [d for (_, s, _, d) in record.rows() if s == server.grpc_address] == [digest]
    assert "fallback share 25.0%" in record.describe()[0]
