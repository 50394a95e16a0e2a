"""Benchmarks: in-process CPU / GPU vs our Triton client vs coffea's triton_wrapper, and scaling.

``coffea-sonic bench SCENARIO`` drives this package (``suite``, ``fairness``, ``e2e``,
``report``, ...). **Adding a scenario** is one new module, ``coffea_sonic/bench/commands/NAME.py``,
and nothing else: the CLI lists that package and calls each module's ``register(subparsers)``::

    '''``coffea-sonic bench NAME``: what it measures.'''
    import argparse

    from ...cliargs import add_list_option
    from . import print_written, progress_printer, scenario_parser


    def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        parser = scenario_parser(                         # with -o/--output, bench-output/NAME
            subparsers, "NAME", help="one line for `coffea-sonic bench --help`",
            description="what it measures\n\nexamples:\n  coffea-sonic bench NAME --quick")
        parser.add_argument("--quick", action="store_true")
        add_list_option(parser, "--clients", type=int)   # lists: spaces or commas
        parser.set_defaults(func=run)
        return parser


    def run(args: argparse.Namespace) -> int:            # exit code; heavy imports in here
        from ..NAME_module import measure, write_results
        results = measure(progress=progress_printer())
        print_written(write_results(results, args.output))
        return 0

tests/test_cli_shape.py checks that every such module registers a parser of its own name.

What scenarios share instead of writing again: client processes that start together
(:class:`~coffea_sonic.bench.clients.ClientPool`; ``measure`` adds Triton's profile and the GPUs'
busy around a window, :func:`~coffea_sonic.bench.clients.timed_calls` is a process's timed loop),
the server's statistics and the GPU sampler (:mod:`~coffea_sonic.bench.probes`), the machine
(:mod:`~coffea_sonic.bench.machine`) and the report on disk (:mod:`~coffea_sonic.bench.files`:
``write_report``, ``write_json``, Markdown ``table`` / ``section`` / ``cell``, ``save_figure``).

From Python:

>>> from coffea_sonic.bench import BenchConfig, ScalingModel
>>> BenchConfig.quick().modes
('cpu', 'local-gpu', 'remote', 'remote-sync', 'coffea-wrapper')
>>> ScalingModel(t_gpu=0.01, t_latency=0.0).saturation_clients()
1.0

A full run (starts the embedded server unless ``server="host:port"``)::

    from coffea_sonic.bench import run_bench, write_outputs
    results = run_bench(BenchConfig.quick())
    write_outputs(results, "bench-output")     # results.json, *.png, results.md
"""

from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "BenchConfig": "coffea_sonic.bench.config",
    "MODES": "coffea_sonic.bench.config",
    "ScalingModel": "coffea_sonic.bench.scaling",
    "ScalingFit": "coffea_sonic.bench.scaling",
    "fit_scaling_model": "coffea_sonic.bench.scaling",
    "machine_info": "coffea_sonic.bench.machine",
    "run_bench": "coffea_sonic.bench.suite",
    "write_outputs": "coffea_sonic.bench.report",
    "markdown_report": "coffea_sonic.bench.report",
    "run_end_to_end": "coffea_sonic.bench.e2e",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
