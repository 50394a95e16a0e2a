"""What a newcomer's first mistakes get: a short message that says what to do, at once.

Each is tried the way a user meets it (the CLI in a subprocess, a script run by Python, a real
tritonserver): a metrics monitor pointed at a gRPC port, a script that starts local Dask workers
without ``if __name__ == "__main__":``, ``serve`` on a port already taken, a served tritonserver
that dies, ``config --set`` with a value TritonModel refuses, and the demo's summary with one
worker.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coffea_sonic import TritonModel
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.server import LocalTritonServer
from helpers import wait_for

CLI = [sys.executable, "-m", "coffea_sonic.cli"]
#: a mistake must be reported this fast (a hang guard on a loaded 2-core box)
AT_ONCE_S = 60


def _cli(*args: str, timeout: float = AT_ONCE_S) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_monitor_given_a_grpc_port_says_so_and_which_url_to_give(
        jet_tagger_server: LocalTritonServer) -> None:
    result = _cli("monitor", jet_tagger_server.grpc_address, "--once")
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text
    assert "looks like a Triton gRPC port" in text
    assert "/metrics" in text and f"triton+grpc://{jet_tagger_server.grpc_address}" in text


def _script(folder: Path, guarded: bool) -> Path:
    body = ('with make_cluster("local", workers=1, timeout_s=60) as cluster:\n'
            '    print("workers", cluster.n_workers())\n')
    if guarded:
        body = 'if __name__ == "__main__":\n' + "".join(f"    {line}\n"
                                                      for line in body.splitlines())
    path = folder / ("guarded.py" if guarded else "unguarded.py")
    path.write_text("from coffea_sonic import make_cluster\n" + body)
    return path


def test_a_script_without_a_main_guard_is_told_the_fix_before_any_worker_starts(
        tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(_script(tmp_path, guarded=False))],
                            capture_output=True, text=True, timeout=AT_ONCE_S, cwd=tmp_path)
    assert time.monotonic() - started < AT_ONCE_S
    assert result.returncode != 0
    assert "ClusterStartError" in result.stderr and 'if __name__ == "__main__":' in result.stderr
    assert "unguarded.py:2" in result.stderr
    assert "bootstrapping" not in result.stderr  # no worker got as far as multiprocessing's error
    guarded = subprocess.run([sys.executable, str(_script(tmp_path, guarded=True))],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    assert "workers 1" in guarded.stdout


def test_serve_on_a_port_that_is_taken_says_so_at_once_without_retrying() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        result = _cli("serve", "--models", "jet_tagger", "--device", "cpu", "--grpc-port",
                      str(port))
        took = time.monotonic() - started
    assert result.returncode != 0
    message = result.stderr
    assert f"port {port}" in message and "in use" in message, message
    assert "choose another port, or 0" in message
    assert "attempt" not in message and took < AT_ONCE_S


def test_serve_says_how_tritonserver_died() -> None:
    process = subprocess.Popen([*CLI, "serve", "--models", "jet_tagger", "--device", "cpu"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []

        def ready() -> bool:
            lines.append(process.stdout.readline())
            return "Press Ctrl-C" in lines[-1] or process.poll() is not None

        wait_for(ready, 180, "coffea-sonic serve to start", interval=0)
        found = re.search(r"pid (\d+)", "".join(lines))
        assert found, lines
        os.kill(int(found.group(1)), signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 1
    assert "exited unexpectedly with signal SIGKILL (9)" in stderr, stderr[-2000:]


@pytest.mark.parametrize("setting, value", [("fallback", "gpu"), ("transport", "foo"),
                                             ("nonfinite", "loud"),
                                             ("connect_timeout_s", "-1")])
def test_config_set_refuses_what_triton_model_refuses_with_the_same_words(
        setting: str, value: str) -> None:
    result = _cli("config", "--set", f"{setting}={value}")
    assert result.returncode == 2
    with pytest.raises(ConfigurationError) as raised:
        TritonModel("triton+grpc://127.0.0.1:8001/jet_tagger", **{setting: value})
    assert str(raised.value) in result.stderr, (result.stderr, str(raised.value))


def test_the_demo_summary_counts_one_worker_in_the_singular(capsys) -> None:
    from coffea_sonic.demo import print_summary

    print_summary({"events": 10, "events_per_s": 5.0, "wall_s": 2.0, "workers": 1, "jets": 3,
                   "client": {}, "provenance": [], "inference_wait_share": None, "server": {},
                   "incidents": []})
    out = capsys.readouterr().out
    assert "1 worker)" in out and "1 workers" not in out
