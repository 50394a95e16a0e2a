"""The ``coffea-sonic`` command's conventions: ``--version``, ``-v`` anywhere, bench scenarios as
subcommands that register themselves, one spelling for lists and output folders, ``--json``."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from coffea_sonic import __version__
from coffea_sonic.bench.commands import register_all, scenario_names
from coffea_sonic.cli import build_parser, main
from coffea_sonic.cliargs import verbosity
from helpers import every_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(action.choices for action in parser._actions
                if isinstance(action, argparse._SubParsersAction))



def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"coffea-sonic {__version__}"


def test_every_subcommand_takes_v_after_its_name():
    parser = build_parser()
    commands = [path for path, _ in every_parser(parser) if path]
    assert ("bench", "suite") in commands and ("models", "list") in commands
    for path, sub in every_parser(parser):
        if path:
            assert any("-v" in action.option_strings for action in sub._actions), path
    assert verbosity(parser.parse_args(["models", "list", "-v"])) == 1
    assert verbosity(parser.parse_args(["-v", "bench", "suite", "-vv"])) == 3
    assert verbosity(parser.parse_args(["sample", "-o", "x"])) == 0


def test_each_bench_scenario_module_registers_a_subcommand_of_its_own_name():
    names = scenario_names()
    assert names[0] == "suite" and {"fairness", "e2e", "report"} <= set(names)
    for name in names:
        module = importlib.import_module(f"coffea_sonic.bench.commands.{name}")
        parser = argparse.ArgumentParser(prog="coffea-sonic bench")
        registered = module.register(parser.add_subparsers(dest="scenario"))
        assert registered.prog.split()[-1] == name and callable(registered.get_default("func"))
        assert registered.get_default("output") == f"bench-output/{name}"
    parser = argparse.ArgumentParser(prog="coffea-sonic bench")
    assert register_all(parser.add_subparsers()) == names


def test_bench_without_a_scenario_lists_the_scenarios(capsys):
    assert main(["bench"]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in scenario_names())
    with pytest.raises(SystemExit):
        main(["bench", "--scenario", "fairness"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_lists_take_spaces_or_commas_and_name_a_bad_item(capsys):
    parser = build_parser()
    args = parser.parse_args(["bench", "suite", "--models", "jet_tagger,emtrk_cnn", "--clients",
                              "1", "2,4", "--modes", "cpu", "remote"])
    assert args.models == ["jet_tagger", "emtrk_cnn"] and args.clients == [1, 2, 4]
    assert parser.parse_args(["serve", "--gpus", "0,1"]).gpus == [0, 1]
    assert parser.parse_args(["serve", "--gpus", "0", "1"]).gpus == [0, 1]
    assert parser.parse_args(["demo", "--files", "a,b.root", "c.root"]).files == ["a,b.root", "c.root"]
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "suite", "--models", "jet_tagger,nope"])
    err = capsys.readouterr().err
    assert "'nope'" in err and "jet_tagger" in err and "--models" in err


@pytest.mark.parametrize("command", [["demo"], ["sample"], ["models", "export"],
                                     ["bench", "suite"], ["bench", "fairness"], ["bench", "e2e"],
                                     ["bench", "report"]])
def test_commands_that_write_a_folder_take_o(command):
    sub = build_parser()
    for name in command:
        sub = _subparsers(sub)[name]
    output = next(action for action in sub._actions if action.dest == "output")
    assert output.option_strings == ["-o", "--output"]


@pytest.mark.parametrize("command", [["check"], ["models", "list"], ["models", "validate"],
                                     ["monitor"]])
def test_reports_offer_json(command):
    sub = build_parser()
    for name in command:
        sub = _subparsers(sub)[name]
    assert any(action.option_strings == ["--json"] for action in sub._actions)


def test_models_list_json_runs_as_a_program():
    completed = subprocess.run([sys.executable, "-m", "coffea_sonic.cli", "models", "list",
                                "--json", "-v"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert '"name": "jet_tagger"' in completed.stdout


@pytest.mark.parametrize("command", [["demo", "--cluster", "slurm"],
                                     ["check", "--on-workers", "slurm"]])
def test_batch_worker_options_reach_make_cluster_only_when_given(command):
    from coffea_sonic.facility.cli import batch_options

    parser = build_parser()
    given = parser.parse_args([*command, "--queue", "short", "--account", "cms", "--walltime",
                               "00:10:00", "--memory", "4GiB"])
    assert batch_options(given) == {"queue": "short", "account": "cms", "walltime": "00:10:00",
                                    "memory": "4GiB"}
    assert batch_options(parser.parse_args(command)) == {}  # the site's jobqueue.yaml decides
