"""README's quickstart works as pasted: its commands and its ``analysis.py``, run as a newcomer runs
them on a fresh clone, print what README says they print.

The blocks are found by the HTML comments above them (``<!-- quickstart: serve -->``, ``sample``,
``analysis``, ``output``). ``coffea-sonic serve`` runs as README writes it, with one change: its
ports are picked free (``--grpc-port 0 --http-port 0 --metrics-port 0``, since other servers may
hold Triton's default ports on a shared machine) and the analysis' ``127.0.0.1:8001`` becomes the
port the server printed. Everything else (the sample command, the script, its working folder
beside ``sonic-sample/``) is README's text, run with this venv's ``coffea-sonic`` and ``python``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import stop_gracefully, wait_for

README = Path(__file__).resolve().parents[1] / "README.md"
BIN = Path(sys.executable).parent
README_ADDRESS = "127.0.0.1:8001"
#: variables of the developer's or CI's own setup that would re-point or change the run
KEPT_SETTINGS = ("COFFEA_SONIC_CACHE", "COFFEA_SONIC_SERVER_ENV", "COFFEA_SONIC_SERVER_PYTHON")


def quickstart_block(name: str) -> str:
    """The fenced block right after ``<!-- quickstart: NAME -->`` in README."""
    match = re.search(rf"<!-- quickstart: {name} -->\n```[a-z]*\n(.*?)\n```", README.read_text(),
                      re.DOTALL)
    assert match, f"README has no block marked <!-- quickstart: {name} -->"
    return match[1]


def command(block: str) -> list[str]:
    """The one command of a bash block (a comment after it dropped), with this venv's executable."""
    lines = [line.split("#", 1)[0].split() for line in block.splitlines()]
    lines = [line for line in lines if line]
    assert len(lines) == 1 and lines[0][0] == "coffea-sonic", block
    return [str(BIN / "coffea-sonic"), *lines[0][1:]]


@pytest.fixture
def newcomer_env(tmp_path) -> dict[str, str]:
    """This environment without COFFEA_SONIC_* settings (a newcomer has none), its run reports
    and endpoints file in the test's folder."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("COFFEA_SONIC_", "DASK_COFFEA_SONIC"))
           or name in KEPT_SETTINGS}
    (tmp_path / "endpoints.toml").write_text("")
    env.update(COFFEA_SONIC_CONFIG=str(tmp_path / "endpoints.toml"),
               COFFEA_SONIC_REPORT_DIR=str(tmp_path / "runs"))
    return env


@pytest.fixture
def readme_server(newcomer_env, tmp_path) -> Iterator[str]:
    """README's serve command on free ports until it printed that it is ready; its gRPC address."""
    argv = command(quickstart_block("serve"))
    assert "--grpc-port" not in argv, "README's serve command gained a port: substitute it here"
    process = subprocess.Popen(
        [*argv, "--grpc-port", "0", "--http-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env=newcomer_env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        wait_for(lambda: process.poll() is not None or any("Press Ctrl-C" in l for l in lines),
                 240, lambda: f"README's serve command to become ready; output:\n{''.join(lines)}")
        assert process.poll() is None, f"serve exited {process.returncode}:\n{''.join(lines)}"
        grpc = [line.split()[1] for line in lines if line.split()[:1] == ["gRPC"]]
        assert grpc, "".join(lines)
        yield grpc[0]
    finally:
        stop_gracefully(process)
        reader.join(10)
        assert not reader.is_alive()


def test_readme_quickstart_runs_as_pasted_and_prints_what_readme_says(
        readme_server, newcomer_env, tmp_path):
    sample = subprocess.run(command(quickstart_block("sample")), cwd=tmp_path, env=newcomer_env,
                            capture_output=True, text=True, timeout=300)
    assert sample.returncode == 0, sample.stderr
    assert (tmp_path / "sonic-sample" / "fileset.json").is_file()

    analysis = quickstart_block("analysis")
    assert analysis.count(README_ADDRESS) == 1, "the quickstart names its server once"
    script = tmp_path / "analysis.py"
    script.write_text(analysis.replace(README_ADDRESS, readme_server))
    run = subprocess.run([str(BIN / "python"), "analysis.py"], cwd=tmp_path, env=newcomer_env,
                         capture_output=True, text=True, timeout=540)
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-4000:]}"
    expected = quickstart_block("output").splitlines()
    assert run.stdout.splitlines() == expected, run.stdout
    # the schema's cross-reference warnings are what README's QuietSchema is there to silence
    assert "cross-ref" not in run.stderr.lower(), run.stderr[-4000:]


def test_readme_opens_with_the_demo_and_test_commands_ci_runs():
    opening = README.read_text().splitlines()[:6]
    assert opening[2:6] == [
        "```bash",
        "python3 dev.py demo    # the main job: sample → embedded Triton server → Dask → coffea → "
        "plot (< 5 min)",
        "python3 dev.py test    # the whole test suite, on real servers, real coffea and real Dask "
        "(what CI runs)",
        "```"], opening
    assert "python3 dev.py test" in (README.parent / ".ci" / "run").read_text()


def test_readme_stays_short_and_links_only_pages_that_exist():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#\s]+)[^)]*\)", text)
    missing = [link for link in links
               if "://" not in link and not (README.parent / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
