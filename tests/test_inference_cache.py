"""The persistent inference cache on the real path: a real tritonserver over gRPC, shared memory
and HTTP, its statistics as the proof of what was (not) sent, real Dask workers sharing one
directory, entries corrupted on disk."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from coffea_sonic import zoo
from coffea_sonic.cache import InferenceCache, read_counters
from coffea_sonic.cache.key import content_blocks
from coffea_sonic.cache.store import decode_entry
from coffea_sonic.errors import ConfigurationError, ServerUnavailableError
from coffea_sonic.model import TritonModel
from coffea_sonic.routing import clear_routers
from coffea_sonic.server import LocalTritonServer
from coffea_sonic.server.repository import write_repository
from helpers import wait_for
from server_side import sent_over

ROWS = 60_000
CHUNK = 15_000


def _url(server: LocalTritonServer, transport: str, version: int | None = None) -> str:
    if transport == "http":
        return f"triton+http://{server.http_address}/jet_tagger" + (f"/{version}" if version else "")
    return server.url("jet_tagger", version)


def _served(model: TritonModel) -> tuple[int, int]:
    stats = model.server_statistics()
    return stats.success_count, stats.inference_count


def _served_once_counted(model: TritonModel, before: tuple[int, int], rows: int = 0,
                         requests: int = 0) -> tuple[int, int]:
    """The server's counts once at least ``requests`` requests and ``rows`` rows more than
    ``before`` are in them: Triton reports a request's statistics after it has sent the answer,
    so a read right after the call may not count it yet."""
    def counted():
        now = _served(model)
        return now if now[0] >= before[0] + requests and now[1] >= before[1] + rows else None

    return wait_for(counted, 30, lambda: f"{requests} requests and {rows} rows more than "
                                         f"{before} in the server's statistics")


def _entries(root) -> list:
    return sorted(p for p in root.rglob("*.out") if not p.name.startswith(".tmp-"))


@pytest.fixture(autouse=True)
def _fresh_routers():
    clear_routers()
    yield
    clear_routers()


@pytest.mark.parametrize("transport", ["grpc", "shm", "http"])
def test_a_second_identical_call_sends_nothing_and_answers_the_same(jet_tagger_server, tmp_path,
                                                                    transport):
    inputs = zoo.example_inputs("jet_tagger", ROWS, seed=1)
    first = TritonModel(_url(jet_tagger_server, transport), cache=tmp_path,
                        transport="auto" if transport == "http" else transport)
    assert first.transport_kind == transport
    before = _served(first)
    with sent_over(transport, jet_tagger_server):
        expected = first(inputs)["probs"]
    after_first = _served_once_counted(first, before, ROWS)
    assert after_first[1] - before[1] == ROWS and first.stats.cache_hits == 0
    # a new object (as in the next run's process) over the same directory
    second = TritonModel(_url(jet_tagger_server, transport), cache=str(tmp_path),
                         transport="auto" if transport == "http" else transport)
    outputs = second(inputs)["probs"]
    assert _served(second) == after_first  # not one request reached the server
    np.testing.assert_array_equal(outputs, expected)
    assert outputs.flags.writeable
    assert second.stats.requests == 0 and second.stats.cache_hit_rows == ROWS
    assert second.stats.cache_bytes_saved == sum(a.nbytes for a in inputs.values())
    counted, processes = read_counters(tmp_path)
    assert processes == 1 and counted.hit_rows == ROWS and counted.miss_rows == ROWS


def test_another_chunk_size_hits_wherever_blocks_line_up(jet_tagger_server, tmp_path):
    inputs = zoo.example_inputs("jet_tagger", ROWS, seed=2)
    url = jet_tagger_server.url("jet_tagger")
    whole = TritonModel(url, cache=tmp_path)(inputs)["probs"]
    rechunked = TritonModel(url, cache=tmp_path)
    parts = [rechunked({name: array[start:start + CHUNK] for name, array in inputs.items()})["probs"]
             for start in range(0, ROWS, CHUNK)]
    np.testing.assert_allclose(np.concatenate(parts), whole, atol=1e-6)
    stats = rechunked.stats
    hit_rate = stats.cache_hit_rows / (stats.cache_hit_rows + stats.cache_miss_rows)
    blocks = content_blocks(inputs, ROWS)
    print(f"chunks of {CHUNK} rows after one call of {ROWS}: {len(blocks)} blocks of "
          f"{ROWS / len(blocks):.0f} rows, hit rate {hit_rate:.3f}")
    # each new chunk edge costs the block around it (two mean blocks on average)
    assert 1 - 6 * ROWS / len(blocks) / CHUNK < hit_rate < 1.0


def test_a_corrupted_entry_is_recomputed_not_returned(jet_tagger_server, tmp_path):
    inputs = zoo.example_inputs("jet_tagger", ROWS, seed=3)
    url = jet_tagger_server.url("jet_tagger")
    writer = TritonModel(url, cache=tmp_path)
    start = _served(writer)
    expected = writer(inputs)["probs"]
    entries = _entries(tmp_path)
    victim, truncated = entries[0], entries[1]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0xFF  # one flipped bit pattern in the payload
    victim.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    model = TritonModel(url, cache=tmp_path)
    before = _served_once_counted(model, start, ROWS)  # the writer's rows counted
    outputs = model(inputs)["probs"]
    np.testing.assert_array_equal(outputs, expected)
    assert model.stats.cache_misses == 2 and model.stats.requests >= 1
    assert model.stats.cache_miss_rows > 0
    after = _served_once_counted(model, before, model.stats.cache_miss_rows)
    assert after[1] - before[1] == model.stats.cache_miss_rows
    decode_entry(victim.read_bytes())  # rewritten whole by the recomputation
    decode_entry(truncated.read_bytes())
    assert read_counters(tmp_path)[0].corrupt == 2


@pytest.fixture(scope="module")
def version_two_server(tmp_path_factory):
    repository = write_repository(tmp_path_factory.mktemp("v2") / "models", ["jet_tagger"])
    shutil.move(repository / "jet_tagger" / "1", repository / "jet_tagger" / "2")
    with LocalTritonServer(repository=repository, device="cpu") as server:
        yield server


def test_a_new_model_version_or_config_does_not_use_the_old_entries(jet_tagger_server,
                                                                      version_two_server,
                                                                      tmp_path):
    inputs = zoo.example_inputs("jet_tagger", 5_000, seed=4)
    TritonModel(jet_tagger_server.url("jet_tagger"), cache=tmp_path)(inputs)
    newer = TritonModel(version_two_server.url("jet_tagger"), cache=tmp_path)
    before = _served(newer)
    newer(inputs)
    assert newer.served_version == "2" and newer.stats.cache_hits == 0
    assert _served_once_counted(newer, before, 5_000)[1] - before[1] == 5_000
    assert {p.parent.name for p in tmp_path.glob("jet_tagger/*/served.json")} == {"1", "2"}


def test_offline_answers_from_the_cache_with_a_pinned_version(tmp_path):
    inputs = zoo.example_inputs("jet_tagger", 3_000, seed=5)
    with LocalTritonServer(models=["jet_tagger"], device="cpu") as server:
        url = server.url("jet_tagger", 1)
        expected = TritonModel(url, cache=tmp_path)(inputs)["probs"]
    clear_routers()
    offline = TritonModel(url, cache=tmp_path, cache_offline=True, connect_timeout_s=2,
                          retry={"total_s": 2})
    np.testing.assert_array_equal(offline(inputs)["probs"], expected)
    assert offline.stats.requests == 0
    with pytest.raises(ServerUnavailableError):
        TritonModel(url, cache=tmp_path, connect_timeout_s=2, retry={"total_s": 2})(inputs)
    with pytest.raises(ConfigurationError, match="pins the version"):
        TritonModel("triton+grpc://127.0.0.1:1/jet_tagger", cache=tmp_path, cache_offline=True)


def test_the_size_limit_evicts_the_oldest_entries(jet_tagger_server, tmp_path):
    url = jet_tagger_server.url("jet_tagger")
    cache = InferenceCache(tmp_path, max_bytes=400_000)
    model = TritonModel(url, cache=cache)
    for seed in range(6):
        model(zoo.example_inputs("jet_tagger", 20_000, seed=10 + seed))
    cache.evict_now()
    entries, size = cache.usage()
    assert 0 < size <= 400_000 and model.stats.cache_misses > entries


def _infer_when_told(model: TritonModel, inputs: dict, queue: str, event: str) -> tuple:
    """On a Dask worker: report ready, wait for the common start, then call through the cache."""
    import os

    from distributed import Event, Queue

    Queue(queue).put(os.getpid())
    if not Event(event).wait(120):
        raise TimeoutError("the test never said go")
    outputs = model(inputs)["probs"]
    return os.getpid(), model.stats.cache_misses, model.stats.cache_miss_rows, outputs


def test_four_dask_workers_writing_the_same_entries_leave_a_consistent_cache(jet_tagger_server,
                                                                             tmp_path):
    from distributed import Client, Event, LocalCluster, Queue

    inputs = zoo.example_inputs("jet_tagger", ROWS, seed=6)
    model = TritonModel(jet_tagger_server.url("jet_tagger"), cache=tmp_path)
    blocks = len(content_blocks(inputs, ROWS))
    start = _served(model)
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(4, timeout=120)
        queue, event = Queue("cache-ready"), Event("cache-go")
        futures = [client.submit(_infer_when_told, model, inputs, "cache-ready", "cache-go",
                                 workers=[address], pure=False)
                   for address in sorted(client.scheduler_info()["workers"])]
        pids = {queue.get(timeout=120) for _ in futures}
        event.set()  # all four look up at once, all miss, all write the same entries
        results = client.gather(futures)
    assert len(pids) == 4 and {pid for pid, *_ in results} == pids
    assert sum(misses for _, misses, _, _ in results) > blocks  # the same entries written twice+
    for *_, outputs in results[1:]:
        np.testing.assert_array_equal(outputs, results[0][-1])
    entries = _entries(tmp_path)
    assert len(entries) == blocks and not list(tmp_path.rglob(".tmp-*"))
    for entry in entries:
        decode_entry(entry.read_bytes())
    reader = TritonModel(jet_tagger_server.url("jet_tagger"), cache=tmp_path)
    before = _served_once_counted(reader, start, sum(rows for _, _, rows, _ in results))
    np.testing.assert_array_equal(reader(inputs)["probs"], results[0][-1])
    assert _served(reader) == before and reader.stats.cache_hit_rows == ROWS


def test_a_ragged_call_is_cached_whole_with_its_counts(trackgnn_server, tmp_path):
    from coffea_sonic.data.hits import generate_hits

    drawn = generate_hits(30, seed=11)
    fields = drawn["fields"]
    rows = np.stack([fields["x"], fields["y"], fields["z"]], axis=1)
    counts = np.asarray(drawn["counts"], dtype=np.int64)
    first = TritonModel(trackgnn_server.url("trackgnn"), cache=tmp_path)
    start = _served(first)
    labels = first({"hits": rows}, counts=counts)["labels"]
    second = TritonModel(trackgnn_server.url("trackgnn"), cache=tmp_path)
    before = _served_once_counted(second, start, requests=first.stats.requests)
    np.testing.assert_array_equal(second({"hits": rows}, counts=counts)["labels"], labels)
    assert _served(second) == before and second.stats.cache_hits == 1
    # other counts over the same rows are another call
    regrouped = np.concatenate([counts[:-2], [counts[-2] + counts[-1]]])
    other = TritonModel(trackgnn_server.url("trackgnn"), cache=tmp_path)
    other({"hits": rows}, counts=regrouped)
    assert other.stats.cache_misses == 1 and other.stats.requests >= 1


def test_answers_of_the_in_process_fallback_are_returned_but_not_stored(tmp_path):
    inputs = zoo.example_inputs("jet_tagger", 2_000, seed=12)
    model = TritonModel("triton+grpc://127.0.0.1:1/jet_tagger/1", cache=tmp_path, fallback="cpu",
                        connect_timeout_s=1, retry={"total_s": 1, "max_attempts": 1})
    outputs = model(inputs)["probs"]
    assert outputs.shape == (2_000, 3) and model.stats.fallback_rows == 2_000
    assert model.stats.cache_misses > 0 and not _entries(tmp_path)
