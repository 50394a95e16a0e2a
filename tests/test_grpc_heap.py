"""The allocator tuning for large messages is done once per process and never overrides a user's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = ("from coffea_sonic.transport.grpc.heap import tune_heap; "
         "print(tune_heap(), tune_heap())")


def _probe(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                                "GLIBC_TUNABLES", "COFFEA_SONIC_MALLOC_TUNING")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={**environment, **env}, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_thresholds_are_set_once_on_glibc():
    assert _probe() == "True True"


@pytest.mark.parametrize("env", [{"COFFEA_SONIC_MALLOC_TUNING": "0"},
                                 {"MALLOC_TRIM_THRESHOLD_": "1048576"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"}])
def test_a_users_malloc_settings_or_opt_out_are_left_alone(env):
    assert _probe(**env) == "False False"
