"""Edges of the transport choice (coffea_sonic.transport.choice) that need no server.

A server off this host (192.0.2.1, a documentation address) never gets shared memory, so the
choice falls back without sending anything; transports open lazily, so nothing connects.
"""
from __future__ import annotations

import logging
import threading

import pytest

from coffea_sonic.core.endpoint import ServerSettings
from coffea_sonic.errors import ConfigurationError
from coffea_sonic.transport.choice import MAX_REPROBES, ServerTransports

REMOTE = ServerSettings("192.0.2.1:8001")
REMOTE_HTTP = ServerSettings("192.0.2.1:8000", protocol="http")


def test_a_remote_server_gets_the_urls_protocol_quietly_under_auto(caplog):
    choice = ServerTransports(REMOTE)
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        assert choice.data_transport().name == "grpc"
        assert choice.kind() == "grpc" and choice.kind(gpu_model=True) == "grpc"
    assert choice.shm_off == "the server is not on this host"
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert choice.data_transport() is choice.data


def test_asking_for_shared_memory_with_a_remote_server_warns_then_refuses(caplog):
    choice = ServerTransports(REMOTE, "shm")
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        with pytest.raises(ConfigurationError, match="transport='shm': cannot use shared memory "
                                                     "with 192.0.2.1:8001 \\(the server is not on this host\\)"):
            choice.data_transport()
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    with pytest.raises(ConfigurationError, match="transport='cuda'"):
        ServerTransports(REMOTE, "cuda").data_transport()


def test_http_needs_an_http_url_and_an_http_url_is_always_plain():
    with pytest.raises(ConfigurationError, match="transport='http' needs triton\\+http:// URLs"):
        ServerTransports(REMOTE, "http").data_transport()
    assert ServerTransports(REMOTE_HTTP, "http").data_transport().name == "http"
    auto = ServerTransports(REMOTE_HTTP)
    assert auto.data_transport().name == "http" and auto.shm_off == ""
    grpc = ServerTransports(REMOTE, "grpc")
    assert grpc.data_transport().name == "grpc" and grpc.shm_off == ""
    assert grpc.control().name == "grpc" and grpc.plain.name == "grpc"


def test_a_factory_carries_control_calls_and_requests():
    made: list[ServerSettings] = []

    def factory(settings: ServerSettings):
        made.append(settings)
        return ServerTransports(settings, "grpc").plain

    choice = ServerTransports(REMOTE, factory)
    assert choice.control().name == "grpc" and choice.data_transport(gpu_model=True).name == "grpc"
    assert made == [REMOTE, REMOTE]


def test_shared_memory_is_turned_off_once_with_the_first_reason(caplog):
    choice = ServerTransports(REMOTE, "grpc")
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        choice.disable_shm("first")
        choice.disable_shm("second")
    assert choice.shm_off == "first" and len(caplog.records) == 1
    assert caplog.records[0].levelno == logging.WARNING
    other = ServerTransports(REMOTE, "grpc")
    other.disable_shm("", quiet=True)
    assert other.shm_off == "shared memory failed"


def test_a_server_that_forgets_regions_with_shared_memory_off_is_not_probed_again():
    choice = ServerTransports(REMOTE, "grpc")
    choice.disable_shm("off", quiet=True)
    for _ in range(MAX_REPROBES + 1):
        choice.region_forgotten("unknown region")
    assert choice.reprobes == MAX_REPROBES + 1 and choice.shm_off == "off"
    assert MAX_REPROBES == 3


def test_a_choice_once_made_is_kept_and_gpu_models_over_grpc_never_try_cuda():
    choice = ServerTransports(REMOTE)
    choice.data_transport()
    kept = ServerTransports(ServerSettings("192.0.2.2:8001"), "grpc").plain
    choice.data = kept
    assert choice.data_transport() is kept and choice.data_transport(gpu_model=True) is kept
    assert choice.kind(gpu_model=True) == "grpc" and choice.cuda_off == "" and choice.cuda is None


# --- A server on this host, with the probes' answers given: the choice's own logic ------------
# The real probes need a tritonserver that maps our memory (tests/test_cuda_choice.py and
# tests/test_transport.py run them); here each probe answers as told and counts its calls, so
# every branch of the choice is reached without one.

LOCAL = ServerSettings("127.0.0.1:8001")


class _NamedTransport:
    def __init__(self, name: str, settings: ServerSettings) -> None:
        self.name, self.settings = name, settings


class _Probes:
    """Stand-ins for the shared-memory and CUDA probes, with the answers a test gives."""

    def __init__(self, monkeypatch, shm=(True, "maps our memory"), cuda=(True, "maps CUDA")):
        import coffea_sonic.transport.shm as shm_package
        import coffea_sonic.transport.shm.cuda as cuda_module
        import coffea_sonic.transport.shm.select as select_module
        from coffea_sonic.transport import choice as choice_module

        self.shm, self.cuda = shm, cuda
        self.shm_calls = self.cuda_calls = self.forgotten = 0
        monkeypatch.setattr(shm_package, "probe_shared_memory", self._probe_shm)
        monkeypatch.setattr(select_module, "probe_shared_memory", self._probe_shm)
        monkeypatch.setattr(select_module, "forget_probe", self._forget)
        monkeypatch.setattr(cuda_module, "probe_cuda_shared_memory", self._probe_cuda)
        # a CUDA transport needs a GPU in this process: a named stand-in takes its place
        real_open = choice_module.open_transport
        monkeypatch.setattr(choice_module, "open_transport", lambda settings, kind: (
            _NamedTransport(kind, settings) if kind == "cuda" else real_open(settings, kind)))

    def _probe_shm(self, grpc):
        assert grpc.name == "grpc" and grpc.settings == LOCAL, "probe the server over its URL"
        self.shm_calls += 1
        return self.shm

    def _forget(self, grpc):
        self.forgotten += 1

    def _probe_cuda(self, grpc):
        assert grpc.name == "grpc" and grpc.settings == LOCAL, "probe the server over its URL"
        self.cuda_calls += 1
        if isinstance(self.cuda, Exception):
            raise self.cuda
        return self.cuda


def test_a_server_on_this_host_that_maps_our_memory_gets_shared_memory(monkeypatch):
    probes = _Probes(monkeypatch)
    assert ServerTransports(LOCAL).data_transport().name == "shm"
    assert ServerTransports(LOCAL, "shm").data_transport().name == "shm"
    assert ServerTransports(LOCAL, "cuda").data_transport().name == "cuda"
    assert probes.shm_calls == 3 and probes.cuda_calls == 0


def test_only_gpu_models_try_cuda_memory_and_the_answer_is_kept(monkeypatch, caplog):
    probes = _Probes(monkeypatch)
    choice = ServerTransports(LOCAL)
    assert choice.data_transport().name == "shm" and choice.kind() == "shm"
    assert probes.cuda_calls == 0 and choice.cuda is None
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        cuda = choice.data_transport(gpu_model=True)
    assert cuda.name == "cuda" and cuda is choice.cuda and choice.cuda_off == ""
    assert "CUDA shared memory" in caplog.text
    assert choice.data_transport(gpu_model=True) is cuda and choice.kind(gpu_model=True) == "cuda"
    assert choice.data_transport().name == "shm" and probes.cuda_calls == 1


def test_a_gpu_model_stays_on_system_memory_where_cuda_fails_with_the_reason_kept(monkeypatch):
    probes = _Probes(monkeypatch, cuda=(False, "no CUDA here"))
    choice = ServerTransports(LOCAL)
    assert choice.data_transport(gpu_model=True).name == "shm"
    assert choice.cuda is None and choice.cuda_off == "no CUDA here"
    assert choice.kind(gpu_model=True) == "shm" and probes.cuda_calls == 1
    silent = ServerTransports(LOCAL)
    probes.cuda = (False, "")
    assert silent.data_transport(gpu_model=True).name == "shm"
    assert silent.cuda_off == "CUDA shared memory failed"


def test_a_cuda_probe_that_raises_is_a_reason_not_an_error(monkeypatch):
    probes = _Probes(monkeypatch, cuda=RuntimeError("CUDA unusable after a fork"))
    choice = ServerTransports(LOCAL)
    assert choice.data_transport(gpu_model=True).name == "shm"
    assert choice.cuda_off == "RuntimeError: CUDA unusable after a fork"
    assert choice.data_transport(gpu_model=True).name == "shm" and probes.cuda_calls == 1


def test_gpu_models_try_cuda_only_under_auto_and_never_over_grpc(monkeypatch):
    probes = _Probes(monkeypatch)
    assert ServerTransports(LOCAL, "shm").data_transport(gpu_model=True).name == "shm"
    over_grpc = ServerTransports(LOCAL, "grpc")
    assert over_grpc.data_transport(gpu_model=True).name == "grpc"
    assert probes.cuda_calls == 0 and over_grpc.cuda_off == ""


def test_a_server_that_forgets_our_regions_is_probed_again_at_most_max_reprobes_times(monkeypatch):
    probes = _Probes(monkeypatch)
    choice = ServerTransports(LOCAL)
    assert choice.data_transport().name == "shm"
    for time in range(1, MAX_REPROBES + 1):
        choice.region_forgotten("unknown region")
        assert choice.shm_off == "" and probes.forgotten == time
    assert choice.data_transport().name == "shm"
    choice.region_forgotten("unknown region")
    assert choice.shm_off == "unknown region" and probes.forgotten == MAX_REPROBES
    assert choice.data_transport().name == "grpc"


def test_a_failed_reprobe_turns_shared_memory_off_with_both_reasons(monkeypatch):
    probes = _Probes(monkeypatch)
    choice = ServerTransports(LOCAL)
    choice.data_transport()
    probes.shm = (False, "a balancer answered")
    choice.region_forgotten("unknown region")
    assert choice.shm_off == "unknown region; probed again: a balancer answered"
    assert choice.data_transport().name == "grpc"


def test_kind_says_grpc_where_making_the_choice_raises():
    from coffea_sonic.transport.errors import TransportError

    def unreachable(settings):
        raise TransportError("down", "no route to the server")

    assert ServerTransports(REMOTE, unreachable).kind() == "grpc"


class _WatchedLock:
    """A lock that says when a second thread is waiting for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiting = threading.Event()

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            self.waiting.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


def test_two_threads_asking_for_cuda_at_once_probe_once_and_share_its_transport(monkeypatch):
    probes = _Probes(monkeypatch)
    choice = ServerTransports(LOCAL)
    choice.data_transport()
    choice._lock = lock = _WatchedLock()
    answer = probes._probe_cuda

    def slow_probe(grpc):
        # the first thread probes while the second waits for the lock
        assert lock.waiting.wait(30), "the second thread never asked for the lock"
        return answer(grpc)

    import coffea_sonic.transport.shm.cuda as cuda_module

    monkeypatch.setattr(cuda_module, "probe_cuda_shared_memory", slow_probe)
    got: dict[str, object] = {}
    errors: list[BaseException] = []

    def ask(name: str) -> None:
        try:
            got[name] = choice.data_transport(gpu_model=True)
        except BaseException as error:  # re-raised below
            errors.append(error)

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    while not lock._lock.locked() and first.is_alive():
        first.join(timeout=0.01)
    second = threading.Thread(target=ask, args=("second",))
    second.start()
    first.join(60)
    second.join(60)
    if errors:
        raise errors[0]
    assert got["first"] is got["second"] is choice.cuda and choice.cuda.name == "cuda"
    assert probes.cuda_calls == 1


def test_what_the_choice_logs_names_the_server_the_reason_and_the_wire(monkeypatch, caplog):
    probes = _Probes(monkeypatch, cuda=(False, "no CUDA here"))
    choice = ServerTransports(LOCAL)
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        choice.data_transport(gpu_model=True)
        choice.region_forgotten("unknown region")
        choice.disable_shm("region error")
    assert [r.getMessage() for r in caplog.records] == [
        "coffea-sonic: GPU models of 127.0.0.1:8001: system shared memory (no CUDA here)",
        "coffea-sonic: 127.0.0.1:8001 forgot our shared-memory regions (unknown region); "
        "registering new ones",
        "coffea-sonic: not using shared memory with 127.0.0.1:8001 (region error); sending "
        "tensors over grpc"]
    caplog.clear()
    probes.cuda = (True, "maps CUDA")
    with caplog.at_level(logging.INFO, logger="coffea_sonic.transport.choice"):
        cuda = ServerTransports(LOCAL).data_transport(gpu_model=True)
    assert cuda.settings == LOCAL
    assert [r.getMessage() for r in caplog.records] == [
        "coffea-sonic: GPU models of 127.0.0.1:8001: CUDA shared memory"]


def test_cuda_asked_for_by_name_is_refused_once_shared_memory_is_off(monkeypatch):
    _Probes(monkeypatch)
    choice = ServerTransports(LOCAL, "cuda")
    assert choice.data_transport().name == "cuda"
    choice.disable_shm("the server forgot our regions", quiet=True)
    with pytest.raises(ConfigurationError, match="transport='cuda': cannot use shared memory with "
                                                 "127.0.0.1:8001 \\(the server forgot our regions\\)"):
        choice.data_transport()
