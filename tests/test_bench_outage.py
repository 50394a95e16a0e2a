"""benchmarks/outage_bench.py (a run whose server is SIGKILLed mid-run, with fallback='cpu',
against a healthy run) starts and explains its options from a checkout; its analysis marks each
finished chunk. The script lives in the repository, not in the package: it is loaded by its
path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "outage_bench.py"


def _load_outage_bench():
    spec = importlib.util.spec_from_file_location("outage_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


outage_bench = _load_outage_bench()


def test_outage_bench_help_teaches_from_a_checkout():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: outage_bench.py ")
    assert "python benchmarks/outage_bench.py --events 4000 -o /tmp/outage" in done.stdout


def test_outage_bench_writes_where_results_md_says_unless_told():
    parser = outage_bench.build_parser()
    args = parser.parse_args(["--events", "4000"])
    assert args.events == 4000
    assert Path(args.output) == ROOT / "benchmarks" / "results" / "cpu2-outage"
    assert "benchmarks/results/cpu2-outage" in (ROOT / "benchmarks" / "RESULTS.md").read_text()
    assert parser.parse_args(["-o", "/tmp/outage"]).output == "/tmp/outage"


def test_marked_analysis_keeps_the_folder_its_chunks_mark():
    analysis = outage_bench.MarkedJetTagging("triton+grpc://127.0.0.1:8001", marks="/tmp",
                                             fallback="cpu")
    assert analysis.marks == "/tmp"
