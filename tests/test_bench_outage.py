"""benchmarks/outage_bench.py (a run whose server is SIGKILLed mid-run, with fallback='cpu',
against a healthy run) starts and explains its options from a checkout; its analysis marks each
finished chunk. The script lives in the repository, not in the package: it is loaded by its
path."""

from __future__ import annotations

from pathlib import Path

from helpers import REPOSITORY, benchmark_script_help, load_benchmark_script

outage_bench = load_benchmark_script("outage_bench")


def test_outage_bench_help_teaches_from_a_checkout():
    shown = benchmark_script_help("outage_bench")
    assert shown.startswith("usage: outage_bench.py ")
    assert "python benchmarks/outage_bench.py --events 4000 -o /tmp/outage" in shown


def test_outage_bench_writes_where_results_md_says_unless_told():
    parser = outage_bench.build_parser()
    args = parser.parse_args(["--events", "4000"])
    assert args.events == 4000
    assert Path(args.output) == REPOSITORY / "benchmarks" / "results" / "cpu2-outage"
    results_md = (REPOSITORY / "benchmarks" / "RESULTS.md").read_text()
    assert "benchmarks/results/cpu2-outage" in results_md
    assert parser.parse_args(["-o", "/tmp/outage"]).output == "/tmp/outage"


def test_marked_analysis_keeps_the_folder_its_chunks_mark():
    analysis = outage_bench.MarkedJetTagging("triton+grpc://127.0.0.1:8001", marks="/tmp",
                                             fallback="cpu")
    assert analysis.marks == "/tmp"
