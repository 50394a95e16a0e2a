"""Shared fixtures: one real embedded tritonserver per test session, serving the whole zoo."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from coffea_sonic.server import LocalTritonServer


#: Modules whose subject is how a server stops: their servers stop the way users' do.
GRACEFUL_STOP_MODULES = {"test_server", "test_standard_repository"}
_graceful_stop = LocalTritonServer.stop


def _stop_at_once(server: LocalTritonServer) -> None:
    """SIGKILL the server's process group, then the launcher's own stop (which reaps it and
    removes its shared-memory regions and folder). A graceful stop takes 2-3 s per server here
    (Triton unloads the models and checks once a second) and 5 s more while an HTTP client keeps
    a connection open; a test's server has nothing to save."""
    process = server.process
    if process is not None and process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _graceful_stop(server)


@pytest.fixture(autouse=True, scope="session")
def _servers_stop_at_once():
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalTritonServer, "stop", _stop_at_once)
        yield


@pytest.fixture(autouse=True, scope="module")
def _graceful_stops_where_tested(request, _servers_stop_at_once):
    if request.module.__name__ not in GRACEFUL_STOP_MODULES:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalTritonServer, "stop", _graceful_stop)
        yield


@pytest.fixture(scope="session")
def triton_server():
    """A real tritonserver serving every zoo model on free loopback ports (CPU)."""
    with LocalTritonServer(device="cpu") as server:
        yield server


@pytest.fixture(scope="module")
def passthrough_server(tmp_path_factory):
    """A server of the transport-bound ``passthrough`` model (x: 16 floats -> y: 2), one per
    module (the modules using it count its requests)."""
    from coffea_sonic.bench.passthrough import write_passthrough

    repository = write_passthrough(tmp_path_factory.mktemp("passthrough"))
    with LocalTritonServer(repository=repository, device="cpu") as server:
        yield server


@pytest.fixture(scope="session")
def jet_tagger_server():
    """A second, light server with only jet_tagger (for tests that restart or kill servers)."""
    with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
        yield server


@pytest.fixture(scope="session")
def trackgnn_server():
    """A server of the tracking pipelines (trackgnn, trackgnn_ensemble), for the tracking suites."""
    with LocalTritonServer(models=["trackgnn", "trackgnn_ensemble"], device="cpu") as server:
        yield server


@pytest.fixture(autouse=True, scope="session")
def _quiet_thread_pools():
    # Two cores shared by server and client: keep onnxruntime/BLAS from oversubscribing them.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory):
    """A private CA and a server certificate for 127.0.0.1 signed by it."""
    directory = tmp_path_factory.mktemp("tls")
    ca_key, ca, key, csr, cert = (directory / name for name in
                                  ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
             str(ca), "-days", "2", "-subj", "/CN=coffea-sonic test CA")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", "/CN=localhost")
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions))
    # a client identity signed by the same CA, for mutual TLS
    client_key, client_csr, client_cert = (directory / name for name in
                                           ("client.key", "client.csr", "client.pem"))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(client_key), "-out",
             str(client_csr), "-subj", "/CN=coffea-sonic test client")
    _openssl("x509", "-req", "-in", str(client_csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(client_cert), "-days", "2")
    return {"ca": str(ca), "cert": str(cert), "key": str(key), "client_cert": str(client_cert),
            "client_key": str(client_key)}


def tls_arguments(certificates: dict, *, mutual: bool = False) -> list[str]:
    """tritonserver's arguments for gRPC over TLS with the test CA's server certificate (and, with
    ``mutual``, a client certificate required)."""
    return ["--grpc-use-ssl=true", f"--grpc-server-cert={certificates['cert']}",
            f"--grpc-server-key={certificates['key']}", f"--grpc-root-cert={certificates['ca']}",
            *(["--grpc-use-ssl-mutual=true"] if mutual else [])]


@pytest.fixture(scope="session")
def tls_server(certificates):
    """A real Triton serving jet_tagger over gRPC with TLS only."""
    with LocalTritonServer(models=["jet_tagger"], device="cpu",
                           extra_args=tls_arguments(certificates)) as server:
        yield server


@pytest.fixture(scope="session")
def restriction():
    """The key of :func:`restricted_tritonserver`'s restricted protocols."""
    from interop_servers import RestrictionKey

    return RestrictionKey("k", "restriction-key-that-must-never-be-printed")


@pytest.fixture(scope="session")
def restricted_tritonserver(restriction):
    """tritonserver started with --grpc-restricted-protocol=model-repository,shared-memory,
    statistics:k=VALUE (and the same --http-restricted-api), serving jet_tagger."""
    from interop_servers import restricted_server

    with restricted_server(restriction) as server:
        yield server


@pytest.fixture(scope="module", params=["grpc", "shm"])
def each_transport(request):
    """Runs a client-level module once per wire a server can be reached by: plain gRPC (what a
    remote GPU server gets) and shared memory (a server on this host).

    Module-scoped, so the setting is in place before any model of the module is built (a model
    fixes its transport when it is made): module fixtures that build models or start Dask
    workers depend on this one, and are made again for the next transport. The setting reaches
    every TritonModel made without an explicit ``transport=``, Dask workers started by the
    module too. Transports of this process are closed between runs, so a ``[grpc]`` run starts
    with no shared-memory region of ours registered on any server. The setting stays until the
    module ends: a module that uses it for some tests only passes ``transport=`` explicitly in
    the others (or parametrizes its own ``transport`` instead)."""
    from coffea_sonic.routing import clear_routers
    from coffea_sonic.transport.registry import close_all_transports

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COFFEA_SONIC_TRANSPORT", request.param)
        clear_routers()
        close_all_transports()
        yield request.param
        clear_routers()
        close_all_transports()


@pytest.fixture(autouse=True)
def _fresh_routers(request):
    """In a client-level module, each test starts with no router of an earlier test: servers
    come and go there, and a port one of them had may be another's now."""
    if "each_transport" not in request.fixturenames:
        yield
        return
    from coffea_sonic.routing import clear_routers

    clear_routers()
    yield
    clear_routers()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "netlab: hosts in network namespaces (coffea_sonic.netlab; needs root, "
                   "skipped elsewhere)")


@pytest.fixture(scope="module")
def dask_two_workers():
    """A Dask client of a LocalCluster with two single-threaded worker processes, on loopback."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        yield client


#: fixtures that start a server or Dask workers (besides every fixture named ``*server``)
SERVER_FIXTURES = ("each_transport", "offline", "dask_client", "cluster", "dask_two_workers")


def pytest_collection_modifyitems(config, items):
    """With ``COFFEA_SONIC_TESTS_IN_PROCESS=1`` (mutation runs: ``scripts/mutmut_run.py``), only
    the tests that need no server nor Dask workers run."""
    if os.environ.get("COFFEA_SONIC_TESTS_IN_PROCESS") != "1":
        return
    keep, drop = [], []
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        needs_server = any(n.endswith("server") or n in SERVER_FIXTURES for n in names)
        (drop if needs_server else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
