"""``coffea_sonic``'s top level: what an analysis uses, imported lazily; the rest in submodules."""

from __future__ import annotations

import subprocess
import sys

import coffea_sonic
from coffea_sonic import errors

ANALYSIS_API = {"TritonModel", "SonicMixin", "RetryPolicy", "YieldGate", "Secret", "TlsOptions",
                "LocalTritonServer", "make_cluster", "deliver_settings", "check_servers",
                "setting", "effective_settings", "model_urls", "configured_models",
                "configured_servers"}


def test_all_holds_the_analysis_api_and_the_errors_and_nothing_else():
    error_classes = {name for name, value in vars(errors).items() if isinstance(value, type)
                     and issubclass(value, errors.SonicError) and name != "NetworkLabError"}
    assert set(coffea_sonic.__all__) == ANALYSIS_API | error_classes | {"__version__"}
    for name in coffea_sonic.__all__:
        assert getattr(coffea_sonic, name) is not None


def test_transports_gateways_and_helpers_live_in_their_submodules():
    from coffea_sonic.columns import jet_features  # noqa: F401
    from coffea_sonic.data import write_sample  # noqa: F401
    from coffea_sonic.facility.gateway import TokenGateway  # noqa: F401
    from coffea_sonic.transport.grpc import GrpcTransport  # noqa: F401
    from coffea_sonic.transport.memory import MemoryTransport  # noqa: F401

    for name in ("GrpcTransport", "MemoryTransport", "TokenGateway", "write_sample",
                 "jet_features", "CpuEngine"):
        assert name not in coffea_sonic.__all__
        assert not hasattr(coffea_sonic, name), name


def test_import_loads_no_heavy_dependency():
    code = ("import sys, coffea_sonic; print(sorted(m for m in ('numpy', 'grpc', 'dask', "
            "'awkward', 'tritonclient', 'torch', 'coffea') if m in sys.modules))")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
