"""Shared fixtures: one real embedded tritonserver per test session, serving the whole zoo."""

from __future__ import annotations

import os

import pytest

from coffea_sonic.server import LocalTritonServer


@pytest.fixture(scope="session")
def triton_server():
    """A real tritonserver serving every zoo model on free loopback ports (CPU)."""
    with LocalTritonServer(device="cpu") as server:
        yield server


@pytest.fixture(scope="session")
def jet_tagger_server():
    """A second, light server with only jet_tagger (for tests that restart or kill servers)."""
    with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
        yield server


@pytest.fixture(autouse=True, scope="session")
def _quiet_thread_pools():
    # Two cores shared by server and client: keep onnxruntime/BLAS from oversubscribing them.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
