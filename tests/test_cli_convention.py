"""The one option convention of ``coffea-sonic``, checked on the real parser, every subcommand at
every depth: help text everywhere, ``-o/--output`` for a folder written, ``--server`` for a server,
one set of ``--device`` choices, TLS options named as the settings are, durations that name their
unit, ``--json`` wherever a result is printed, and old spellings that still work and warn."""

from __future__ import annotations

import argparse
import json
import re
import warnings

import pytest
import uproot

from coffea_sonic.cli import build_parser, main
from coffea_sonic.cliargs import DEVICE_CHOICES, DeprecatedAlias
from coffea_sonic.core.settings import SETTINGS
from helpers import every_parser

# Folders a command reads (or shares as a cache) rather than writes its results into.
FOLDER_INPUTS = {
    ("serve", "--repository"): "the repository it serves",
    ("models", "validate", "directory"): "the repository it checks",
    ("server", "install", "--wheels"): "wheels it installs from",
    ("demo", "--inference-cache"): "a cache shared by runs, not this run's results",
    ("monitor", "--inference-cache"): "caches it reads counters from",
    ("monitor", "--shadow"): "reports it reads",
    ("bench", "trace", "--analyse"): "an earlier run's folder it reads",
}

# Commands that print no result of their own, so no --json.
NO_RESULT = {
    ("serve",): "runs a server until stopped; its addresses are a banner, not a result",
    ("demo",): "writes its results (summary.json, histograms, plot) into -o DIR",
    ("bench",): "without a scenario it lists the scenarios (a help text)",
    **{("bench", name): "writes its results (JSON files, tables, figures) into -o DIR"
       for name in ("suite", "cache", "e2e", "fairness", "link", "pipeline", "ragged",
                    "reference", "report", "soak", "trace", "transport", "window", "wrapper")},
}

DURATION_WORDS = re.compile(r"timeout|interval|duration|window|stagger|delay|threshold|seconds|"
                            r"wait|latency|period")
DURATION_UNIT = re.compile(r"-(s|ms|us)$|seconds$")

# Every old spelling: (old argv, the same with the new spelling).
DEPRECATED = [
    (["serve", "--startup-timeout", "30"], ["serve", "--startup-timeout-s", "30"]),
    (["models", "add", "m.onnx", "--name", "m", "--repository", "R"],
     ["models", "add", "m.onnx", "--name", "m", "-o", "R"]),
    (["demo", "--cache", "C"], ["demo", "--inference-cache", "C"]),
    (["sample", "--files", "3"], ["sample", "--n-files", "3"]),
    (["check", "--ssl"], ["check", "--tls"]),
    (["check", "--ssl-ca", "ca.pem"], ["check", "--ca-file", "ca.pem"]),
    (["check", "--ssl-cert", "c.pem"], ["check", "--cert-file", "c.pem"]),
    (["check", "--ssl-key", "k.pem"], ["check", "--key-file", "k.pem"]),
    (["check", "--ssl-target-name", "t"], ["check", "--server-name", "t"]),
    (["check", "--timeout", "2.5"], ["check", "--timeout-s", "2.5"]),
    (["monitor", "--interval", "3"], ["monitor", "--interval-s", "3"]),
    (["monitor", "--threshold", "50"], ["monitor", "--threshold-us", "50000"]),
    (["monitor", "--cache", "C", "--cache", "D"],
     ["monitor", "--inference-cache", "C", "--inference-cache", "D"]),
    (["bench", "cache", "--stagger", "1"], ["bench", "cache", "--stagger-s", "1"]),
    (["bench", "pipeline", "--duration", "2"], ["bench", "pipeline", "--duration-s", "2"]),
    (["bench", "transport", "--duration", "2"], ["bench", "transport", "--duration-s", "2"]),
    (["bench", "window", "--window", "2"], ["bench", "window", "--window-s", "2"]),
    (["bench", "reference", "--window", "2"], ["bench", "reference", "--window-s", "2"]),
    (["bench", "ragged", "--json", "r.json"], ["bench", "ragged", "--json-file", "r.json"]),
    (["bench", "soak", "--json", "s.json"], ["bench", "soak", "--json-file", "s.json"]),
    *[(["bench", name, "--out", "X"], ["bench", name, "-o", "X"])
      for name in ("link", "pipeline", "transport", "window", "wrapper")],
]



def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """What ``--help`` shows: no help, no subcommands, no hidden old spellings, no added -v."""
    return [action for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction,
                                       argparse._VersionAction, DeprecatedAlias))
            and not action.dest.startswith("_verbose_level")]


def _name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


def _every_option():
    for path, parser in every_parser(build_parser()):
        for action in _options(parser):
            yield path, action


def _leaf_commands():
    return [(path, parser) for path, parser in every_parser(build_parser())
            if path and parser.get_default("func") is not None]


def test_every_subcommand_has_help_text():
    missing = []
    for path, parser in every_parser(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                missing += [path + (name,) for name in action.choices
                            if not (helps.get(name) or "").strip()]
    assert not missing, f"subcommands without help: {missing}"


def test_every_option_has_help_text():
    missing = [(path, _name(action)) for path, action in _every_option()
               if not (action.help or "").strip() or action.help == argparse.SUPPRESS]
    assert not missing, f"options without help: {missing}"


def test_a_folder_a_command_writes_is_o_output():
    for path, action in _every_option():
        if action.dest == "output" and "DIR" in str(action.metavar):
            assert action.option_strings == ["-o", "--output"], path
        elif "DIR" in str(action.metavar):
            assert path + (_name(action),) in FOLDER_INPUTS, (
                f"{' '.join(path)} {_name(action)} takes a DIR: a folder written is -o/--output; "
                "a folder read goes into FOLDER_INPUTS with what it is")


def test_a_server_is_named_with_server():
    takes_server = set()
    for path, action in _every_option():
        if str(action.metavar).startswith(("URL", "GRPC")):
            if action.option_strings:
                assert action.option_strings == ["--server"], (path, action.option_strings)
                takes_server.add(path)
            else:  # a positional URL is only a shortcut beside --server
                assert "--server" in (action.help or ""), path
        assert not any(re.search(r"--(url|triton|endpoint)", flag)
                       for flag in action.option_strings), (path, action.option_strings)
    assert {("check",), ("monitor",), ("demo",), ("bench", "suite")} <= takes_server


def test_device_choices_are_the_same_everywhere():
    devices = [(path, action) for path, action in _every_option() if action.dest == "device"]
    assert len(devices) >= 6
    for path, action in devices:
        assert tuple(action.choices) == DEVICE_CHOICES, (path, action.choices)


def test_tls_options_are_named_as_the_settings_are():
    setting_names = {setting.name for setting in SETTINGS}
    for path, action in _every_option():
        assert not any(flag.startswith("--ssl") for flag in action.option_strings), path
    check = dict(every_parser(build_parser()))[("check",)]
    dests = {action.dest for action in _options(check)}
    tls = {"ca_file", "cert_file", "key_file", "server_name", "token_env", "token_file",
           "protocol_key_name", "protocol_key_env", "protocol_key_file"}
    assert tls <= dests and tls <= setting_names
    for action in _options(check):
        if action.dest in tls:
            assert _name(action) == "--" + action.dest.replace("_", "-"), _name(action)


def test_durations_say_their_unit():
    for path, action in _every_option():
        name = _name(action)
        if action.type in (int, float) and DURATION_WORDS.search(name):
            assert DURATION_UNIT.search(name), f"{' '.join(path)} {name}: say the unit (-s/-ms/-us)"


def test_commands_that_print_a_result_offer_json():
    for path, parser in _leaf_commands():
        json_options = [action for action in _options(parser) if "--json" in action.option_strings]
        for action in json_options:  # --json is the flag, never a file name
            assert isinstance(action, argparse._StoreTrueAction), path
        if path not in NO_RESULT:
            assert json_options, f"{' '.join(path)} prints a result: offer --json (or say in " \
                                 "NO_RESULT why it prints none)"
    leaves = {path for path, _ in _leaf_commands()}
    assert set(NO_RESULT) - leaves == set(), "NO_RESULT names no command"


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = build_parser().parse_args(argv)
    return args, [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]


@pytest.mark.parametrize("old, new", DEPRECATED, ids=[" ".join(old) for old, _ in DEPRECATED])
def test_an_old_spelling_parses_as_the_new_one_and_warns(old, new):
    old_args, old_warnings = _parse(old)
    new_args, new_warnings = _parse(new)
    assert vars(old_args) == vars(new_args)
    assert not new_warnings
    _, flag = _path_and_flag(old, new)
    assert len(old_warnings) == old.count(flag)
    new_spelling = next(arg for arg in new if arg.startswith("-") and arg not in old)
    for caught in old_warnings:
        message = str(caught.message)
        assert f"{flag} is deprecated" in message and new_spelling.lstrip("-") in message, message


def _path_and_flag(old: list[str], new: list[str]) -> tuple[tuple[str, ...], str]:
    """The subcommand ``old`` runs and the old option in it."""
    parsers = dict(every_parser(build_parser()))
    path: tuple[str, ...] = ()
    for arg in old:
        if path + (arg,) not in parsers:
            break
        path += (arg,)
    return path, next(arg for arg in old if arg.startswith("--") and arg not in new)


def test_every_old_spelling_is_tested():
    covered = {_path_and_flag(old, new) for old, new in DEPRECATED}
    found = {(path, action.option_strings[0]) for path, parser in every_parser(build_parser())
             for action in parser._actions if isinstance(action, DeprecatedAlias)}
    assert found - covered == set(), "add these old spellings to DEPRECATED"


def test_hidden_old_spellings_stay_out_of_help(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = capsys.readouterr().out
    assert "--ca-file" in out and "--ssl-ca" not in out and "--timeout-s" in out


def test_models_add_old_output_tensor_spelling_lands_in_output_tensor():
    args, caught = _parse(["models", "add", "m.pt", "--name", "m", "-o", "repo", "--output",
                           "OUTPUT__0:FP32:-1,3", "--output-tensor", "OUTPUT__1:FP32:3"])
    assert args.output == "repo"
    assert args.output_tensor == ["OUTPUT__0:FP32:-1,3", "OUTPUT__1:FP32:3"]
    assert len(caught) == 1 and "--output-tensor" in str(caught[0].message)
    new, none = _parse(["models", "add", "m.pt", "--name", "m", "--output", "repo"])
    assert new.output == "repo" and not none


def test_monitor_threshold_in_ms_becomes_microseconds():
    args, caught = _parse(["monitor", "--threshold", "100"])
    assert args.threshold_us == 100_000 and caught
    assert build_parser().parse_args(["monitor"]).threshold_us == 100_000


def test_check_and_monitor_take_servers_by_option_or_position():
    from coffea_sonic.facility.cli import servers

    args = build_parser().parse_args(["check", "--server", "a:8001", "b:8001"])
    assert servers(args) == ["a:8001", "b:8001"]
    args = build_parser().parse_args(["monitor", "--server", "a:8002", "--server", "c:8002"])
    assert servers(args) == ["a:8002", "c:8002"]


def test_sample_says_what_it_wrote(tmp_path, capsys):
    output = tmp_path / "sample"
    assert main(["sample", "-o", str(output), "--events", "30", "--n-files", "2",
                 "--datasets", "ttbar"]) == 0
    out = capsys.readouterr().out
    for index, events in ((0, 15), (1, 15)):
        path = output / f"ttbar_{index}.root"
        assert uproot.open(path)["Events"].num_entries == events
        line = next(line for line in out.splitlines() if str(path) in line)
        assert f"{events} events" in line and re.search(r"\d+(\.\d)? (B|KiB|MiB)", line), line
    assert str(output / "fileset.json") in out and "30 events" in out

    assert main(["sample", "-o", str(output), "--events", "30", "--n-files", "2",
                 "--datasets", "ttbar", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["events"] == 30 and document["fileset"] == str(output / "fileset.json")
    assert [entry["path"] for entry in document["files"]] == [
        str(output / "ttbar_0.root"), str(output / "ttbar_1.root")]
    assert document["bytes"] == sum((output / f"ttbar_{i}.root").stat().st_size for i in (0, 1))
