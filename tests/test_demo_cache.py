"""``coffea-sonic demo --inference-cache DIR`` twice: the second run sends no inference request (the
embedded server's own statistics say so) and fills identical histograms; a third run with
another chunk size is answered mostly from the cache; ``monitor --inference-cache`` sums every worker."""

from __future__ import annotations

import json
import subprocess
import sys

from coffea_sonic.cli import main as cli_main

EVENTS = 4000


def _demo(output, cache, chunksize: int) -> dict:
    completed = subprocess.run(
        [sys.executable, "-m", "coffea_sonic.cli", "demo", "--events", str(EVENTS), "--chunksize",
         str(chunksize), "--output", str(output), "--device", "cpu", "--no-progress",
         "--inference-cache", str(cache)],
        capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return json.loads((output / "summary.json").read_text())


def test_demo_twice_with_the_cache_sends_nothing_the_second_time(tmp_path, capsys):
    cache = tmp_path / "cache"
    first = _demo(tmp_path / "first", cache, 2000)
    second = _demo(tmp_path / "second", cache, 2000)
    models = set(first["server"])
    assert models == {"jet_tagger", "particlenet", "deepmet"}
    for name in models:
        assert first["server"][name]["success_count"] > 0
        assert second["server"][name]["success_count"] == 0, second["server"][name]
        assert second["client"][name]["requests"] == 0
        assert second["client"][name]["cache_miss_rows"] == 0
        assert second["client"][name]["cache_hit_rows"] == first["client"][name]["rows"]
    assert second["histograms"] == first["histograms"] and len(first["histograms"]) >= 4
    assert second["cutflow"] == first["cutflow"]

    third = _demo(tmp_path / "third", cache, 700)  # coffea: 3 chunks of 667 per 2000-event file
    assert third["histograms"] == first["histograms"]
    for name in models:
        client = third["client"][name]
        rate = client["cache_hit_rows"] / (client["cache_hit_rows"] + client["cache_miss_rows"])
        print(f"{name}: chunks of 667 events after 2000: hit rate {rate:.3f}, "
              f"{third['server'][name]['success_count']} requests")
        assert 0 < rate < 1

    capsys.readouterr()
    assert cli_main(["monitor", "--inference-cache", str(cache), "--frames", "1", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["inference_caches"][0]
    assert record["processes"] >= 2 and record["entries"] > 0
    assert record["hit_rows"] >= sum(second["client"][n]["cache_hit_rows"] for n in models)
