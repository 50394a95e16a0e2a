"""``coffea-sonic bench``: a tiny real run (real tritonserver, our client, coffea's triton_wrapper,
onnxruntime in-process), its JSON layout, outputs equal across modes, the scaling model, the CLI."""

from __future__ import annotations

import json
import mmap

import numpy as np
import pytest

from coffea_sonic import cli
from coffea_sonic.bench import BenchConfig, ScalingModel, fit_scaling_model
from coffea_sonic.bench.client import ClientJob, run_client
from coffea_sonic.bench.config import MODES
from coffea_sonic.bench.modes import RunnerSpec, make_runner
from coffea_sonic.bench.probes import PeakRss
from coffea_sonic.errors import ConfigurationError

TOP_LEVEL_KEYS = {"schema", "machine", "config", "server", "modes_run", "skipped", "measurements",
                  "equality", "targets", "scaling", "e2e", "elapsed_s"}
RECORD_KEYS = {"mode", "model", "batch_size", "in_flight", "clients", "chunk_rows", "sweeps",
               "rows_per_s", "events_per_s", "latency", "tensor_bytes_per_chunk",
               "payload_bytes_per_chunk", "client_rss", "server", "gpu", "max_abs_diff",
               "effective_batch", "chunk_seconds"}


@pytest.fixture(scope="module")
def tiny_run(jet_tagger_server, tmp_path_factory):
    """One tiny bench through the real CLI against the shared jet_tagger server."""
    output = tmp_path_factory.mktemp("bench")
    code = cli.main(["bench", "suite", "--preset", "tiny", "--server", jet_tagger_server.url("jet_tagger"),
                     "--output", str(output)])
    with open(output / "results.json") as handle:
        results = json.load(handle)  # strict JSON: no NaN / Infinity
    return code, output, results


def test_cli_bench_writes_json_markdown_and_plots(tiny_run):
    code, output, results = tiny_run
    assert code == 0
    for name in ("results.json", "results.md", "throughput_vs_batch.png",
                 "throughput_vs_clients.png"):
        assert (output / name).stat().st_size > 0, name
    markdown = (output / "results.md").read_text()
    for heading in ("## Throughput by mode and batch size", "## Concurrent client processes",
                    "## Targets", "## Scaling model", "## Outputs equal across modes"):
        assert heading in markdown


def test_json_has_machine_versions_config_and_raw_samples(tiny_run):
    _, _, results = tiny_run
    assert TOP_LEVEL_KEYS <= set(results)
    assert results["schema"] == "coffea-sonic-bench/1"
    machine = results["machine"]
    assert machine["cpu_cores"] >= 1 and machine["cpu_model"] and machine["date"]
    assert machine["versions"]["coffea"] and machine["versions"]["tritonclient"]
    assert results["server"]["embedded"] is False  # --server was honoured
    for record in results["measurements"]:
        assert RECORD_KEYS <= set(record), sorted(RECORD_KEYS - set(record))
        assert len(record["rows_per_s"]["samples"]) == results["config"]["repetitions"]
        assert record["latency"]["count"] > 0


def test_every_mode_ran_with_nonzero_throughput(tiny_run):
    _, _, results = tiny_run
    expected = [mode for mode in MODES
                if mode not in {entry.get("mode") for entry in results["skipped"]}]
    assert results["modes_run"] == expected
    assert {"cpu", "remote", "remote-sync", "coffea-wrapper"} <= set(expected)
    for mode in expected:
        records = [r for r in results["measurements"] if r["mode"] == mode]
        assert records, mode
        assert all(r["rows_per_s"]["median"] > 0 and r["events_per_s"]["median"] > 0
                   for r in records), mode
    served = [r for r in results["measurements"] if r["mode"] != "cpu"]
    assert all(r["server"]["inference_count"] > 0 for r in served)


def test_outputs_equal_across_modes_on_the_same_inputs(tiny_run):
    _, _, results = tiny_run
    equality = results["equality"]
    assert equality["all_equal"] is True
    per_mode = equality["max_abs_diff"]["jet_tagger"]
    assert set(per_mode) == set(results["modes_run"])
    assert max(per_mode.values()) <= 1e-5


def test_targets_and_scaling_fit_are_reported(tiny_run):
    _, _, results = tiny_run
    names = {target["name"] for target in results["targets"]}
    assert any("coffea triton_wrapper" in name for name in names)
    assert any("RSS" in name for name in names)
    fit = results["scaling"]["jet_tagger"]
    assert fit["clients"] == [1.0, 2.0]
    assert fit["model"]["t_gpu"] > 0 and fit["model"]["recommended_cpu_per_gpu"] >= 1
    assert set(fit["network_bound_clients"]) == {"10"}


def test_scaling_model_saturates_at_t_ideal_over_t_gpu():
    model = ScalingModel(t_gpu=0.01, t_latency=0.002, p=0.8, t_cpu=0.1, n_gpu=2)
    assert model.t_ideal == pytest.approx(0.02 + 0.01 + 0.002)
    assert model.saturation_clients() == pytest.approx(2 * 0.032 / 0.01)
    # unsaturated: every client runs at t_ideal; saturated: the GPUs bound the aggregate rate
    assert model.time_per_event(1) == pytest.approx(model.t_ideal)
    assert model.throughput(100) == pytest.approx(2 / 0.01)
    assert model.network_bound_clients(10, bytes_per_event=1.25e6) == pytest.approx(
        10e9 / 8 / (1.25e6 / 0.032))


def test_scaling_fit_recovers_known_parameters_and_uses_server_hint_when_unsaturated():
    truth = ScalingModel(t_gpu=0.003, t_latency=0.009)
    clients = [1, 2, 4, 8, 16]
    fit = fit_scaling_model(clients, [truth.throughput(n) for n in clients])
    assert fit.model.t_gpu == pytest.approx(0.003, rel=0.02)
    assert fit.model.t_latency == pytest.approx(0.009, rel=0.02)
    assert fit.saturation_observed
    linear = fit_scaling_model([1, 2], [100.0, 200.0], t_gpu_hint=0.001)
    assert not linear.saturation_observed
    assert linear.model.t_gpu == pytest.approx(0.001, rel=0.1)


def test_peak_rss_counts_memory_freed_inside_the_block():
    with PeakRss() as rss:
        # 64 MiB of fresh pages, written and given back inside the block (not from malloc: with
        # the gRPC transport's heap tuning, memory freed by earlier tests stays in the heap and a
        # large array may reuse pages that are resident already)
        pages = mmap.mmap(-1, 64 << 20)
        written = np.frombuffer(pages, dtype=np.uint8)
        written[::mmap.PAGESIZE] = 1
        del written
        pages.close()
    assert rss.growth_bytes > 48_000_000


def test_cpu_runner_splits_chunks_and_times_each_request():
    result = run_client(ClientJob(mode="cpu", model="jet_tagger", batch_size=300, chunk_rows=1000,
                                  repetitions=2, keep_outputs=True))
    assert result["requests_per_chunk"] == 4
    assert result["outputs"]["probs"].shape == (1000, 3)
    assert len(result["latencies_s"]) == 8


def test_unknown_mode_or_model_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="choose from"):
        make_runner(RunnerSpec(mode="telepathy", model="jet_tagger", batch_size=8))
    with pytest.raises(ConfigurationError, match="unknown bench modes"):
        BenchConfig(modes=("cpu", "fpga"))
    with pytest.raises(ConfigurationError, match="needs a server address"):
        make_runner(RunnerSpec(mode="remote", model="jet_tagger", batch_size=8))


@pytest.mark.slow
def test_end_to_end_demo_analysis_reports_inference_share_and_speedup(triton_server):
    """The demo analysis (real coffea Runner, real Dask workers) in-process vs served."""
    from coffea_sonic.bench.e2e import analysis_scaling, run_end_to_end

    config = BenchConfig.tiny(e2e_events=2000, e2e_workers=(1,))
    e2e = run_end_to_end(config.e2e_events, list(config.e2e_workers),
                         server_address=triton_server.grpc_address)
    rows = {row["inference"]: row for row in e2e["rows"]}
    assert set(rows) == {"cpu", "served"}
    assert rows["cpu"]["events"] == rows["served"]["events"] == 2000
    assert rows["cpu"]["inference_rows"] == rows["served"]["inference_rows"]
    assert rows["cpu"]["histograms"] and rows["cpu"]["histograms"] == rows["served"]["histograms"]
    assert 0 < rows["cpu"]["inference_share"] < 1
    assert rows["served"]["speedup"] > 0 and rows["served"]["server_busy_s"] > 0
    analysis = analysis_scaling(e2e, config)
    assert analysis["model"]["p"] == pytest.approx(rows["cpu"]["inference_share"])
    assert analysis["model"]["recommended_cpu_per_gpu"] >= 1


def test_soak_keeps_descriptors_and_memory_flat_and_rejects_bad_inputs(jet_tagger_server):
    from coffea_sonic.bench.commands.soak import SoakConfig, run_soak

    config = SoakConfig(requests=400, report_every=100, urls=(jet_tagger_server.url("jet_tagger"),))
    verdict, samples = run_soak(config)
    assert verdict["ok"], verdict
    assert verdict["requests"] == 400 and verdict["rejected_bad_inputs"] == 2
    assert [sample["requests"] for sample in samples] == [4, 100, 200, 300, 400]


def test_ragged_requests_carry_the_unpadded_rows_and_one_count_per_event():
    from coffea_sonic.bench.commands.ragged import measure

    result = measure(events_per_dataset=200, seed=3, cap=64 * 1024)
    pf, pn = result["pf_candidates_per_event"], result["constituents_per_jet"]
    for part, row_bytes in ((pf, 5 * 4), (pn, pn["values_per_row"] * 4)):
        counted = part["multiplicity"]
        assert part["ragged_bytes"] == counted["total"] * row_bytes + counted["entries"] * 8
        assert part["ragged_requests"] > 1  # the cap splits the calls
        assert part["ragged_bytes"] < part["padded_to_sample_max_bytes"]
    assert pf["ragged_bytes"] < pf["padded_to_request_max_bytes"]
