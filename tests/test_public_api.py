"""``coffea_sonic``'s top level: what an analysis uses, imported lazily; the rest in submodules."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import types
import warnings

import pytest

import coffea_sonic
from coffea_sonic.transport.errors import TransportError

ANALYSIS_API = {"TritonModel", "SonicMixin", "RetryPolicy", "Secret", "InferenceStats",
                "columns", "LocalTritonServer", "make_cluster", "check_servers"}

#: moved to their submodules; the old import warns for one release
MOVED = {"YieldGate": "coffea_sonic.share", "TlsOptions": "coffea_sonic.core",
         "deliver_settings": "coffea_sonic.facility.cluster", "setting": "coffea_sonic.config",
         "effective_settings": "coffea_sonic.config", "model_urls": "coffea_sonic.config",
         "configured_models": "coffea_sonic.config", "configured_servers": "coffea_sonic.config"}

#: SonicError subclasses that never reach a user: the client turns them into exported ones
INTERNAL_ERRORS = {TransportError}


def _client_and_cli_error_classes() -> set[type]:
    """Every SonicError subclass defined in the client, glue, core and CLI modules (the package
    minus the benchmarks, the network lab's own subclasses and the server's private ones)."""
    found: set[type] = set()
    for info in pkgutil.walk_packages(coffea_sonic.__path__, "coffea_sonic."):
        if info.name.startswith(("coffea_sonic.bench", "coffea_sonic.netlab", "coffea_sonic.zoo",
                                 "coffea_sonic.examples")):
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an extra (torch, onnxruntime...) this venv may lack
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, coffea_sonic.SonicError)
                    and value.__module__ == info.name and not value.__name__.startswith("_")):
                found.add(value)
    return found - INTERNAL_ERRORS


def test_all_holds_the_analysis_api_and_every_error_a_user_can_meet():
    errors = {cls.__name__ for cls in _client_and_cli_error_classes()}
    assert {"ShadowDivergenceError", "InconsistentVersionsError", "PreflightError"} <= errors
    assert set(coffea_sonic.__all__) == ANALYSIS_API | errors | {"__version__"}
    for name in coffea_sonic.__all__:
        assert getattr(coffea_sonic, name) is not None
    assert isinstance(coffea_sonic.columns, types.ModuleType)
    assert coffea_sonic.columns.jet_features is not None


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_still_imports_from_the_top_level_and_says_where_it_lives(name):
    with pytest.warns(DeprecationWarning, match=rf"from {MOVED[name]} import {name}"):
        old = getattr(coffea_sonic, name)
    assert old is getattr(importlib.import_module(MOVED[name]), name)
    assert name not in coffea_sonic.__all__ and name not in dir(coffea_sonic)


def test_from_import_of_a_moved_name_warns_once_at_the_importing_line():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from coffea_sonic import YieldGate\n")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
    assert completed.returncode == 0, completed.stderr
    warned = [line for line in completed.stderr.splitlines() if "DeprecationWarning" in line]
    assert warned == ["<string>:2: DeprecationWarning: coffea_sonic.YieldGate moved: import it as "
                      "`from coffea_sonic.share import YieldGate` (the old import works for one "
                      "release)"]


def test_the_public_names_import_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in coffea_sonic.__all__:
            getattr(coffea_sonic, name)


def test_transports_gateways_and_helpers_live_in_their_submodules():
    from coffea_sonic.columns import jet_features  # noqa: F401
    from coffea_sonic.data import write_sample  # noqa: F401
    from coffea_sonic.facility.gateway import TokenGateway  # noqa: F401
    from coffea_sonic.transport.grpc import GrpcTransport  # noqa: F401
    from coffea_sonic.transport.memory import MemoryTransport  # noqa: F401

    for name in ("GrpcTransport", "MemoryTransport", "TokenGateway", "write_sample",
                 "jet_features", "CpuEngine", "TransportError"):
        assert name not in coffea_sonic.__all__
        assert not hasattr(coffea_sonic, name), name


def test_import_loads_no_heavy_dependency():
    code = ("import sys, coffea_sonic; print(sorted(m for m in ('numpy', 'grpc', 'dask', "
            "'awkward', 'tritonclient', 'torch', 'coffea') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
