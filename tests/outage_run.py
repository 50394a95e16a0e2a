"""A coffea run whose server dies at a known point: :class:`GatedJetTagging` and :class:`KillMidRun`.

Chunks take tickets in the order they start (files created with O_EXCL in a gate folder, shared
by the worker processes of this machine), so the first ``free_chunks`` always run before the
kill and never wait behind a held one; every later chunk waits until the victim was killed.
So the kill always lands inside the run, whatever order Dask picks.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

from coffea_sonic.examples.jet_tagging import JetTaggingProcessor
from coffea_sonic.server import LocalTritonServer
from helpers import CheckedThread, wait_for

#: how often the watcher and the held chunks look at the gate (a wait on a condition, not a delay)
POLL_S = 0.01
#: the watcher gives up (and the test fails) if the run's first chunks are not done by then
WATCH_TIMEOUT_S = 90.0
#: how long a held chunk waits for the kill before it fails the run
GATE_TIMEOUT_S = 120.0


class GatedJetTagging(JetTaggingProcessor):
    """The example analysis, whose chunks after the first ``free_chunks`` wait for a kill.

    A chunk marks itself done in ``gate``; :class:`KillMidRun` kills the victim once every free
    chunk is done and then opens the gate.
    """

    def __init__(self, *args: Any, gate: str, free_chunks: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.free_chunks = free_chunks

    def _ticket(self) -> int:
        index = 0
        while True:
            try:
                os.close(os.open(os.path.join(self.gate, f"started-{index}"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                return index
            except FileExistsError:
                index += 1

    def process(self, events: Any) -> dict[str, Any]:
        index = self._ticket()
        if index >= self.free_chunks:
            wait_for(lambda: os.path.exists(os.path.join(self.gate, "killed")), GATE_TIMEOUT_S,
                     f"chunk {index} to be let through after the kill", interval=POLL_S)
        output = super().process(events)
        with open(os.path.join(self.gate, f"done-{index}"), "w"):
            pass
        return output


class KillMidRun:
    """Thread that SIGKILLs ``victim`` once the free chunks of a :class:`GatedJetTagging` run are
    done, and opens the gate for the rest of the run; with ``restart`` (a callable starting a
    server in the victim's place) it starts one ``restart_after_s`` after the kill.

    ``stop()`` ends the watch; ``join()`` re-raises any error the thread met. ``killed`` is set
    once the signal was sent; ``restarted`` holds the new server.
    """

    def __init__(self, victim: LocalTritonServer, gate: str, free_chunks: int, *,
                 restart: Callable[[], LocalTritonServer] | None = None,
                 restart_after_s: float = 0.0) -> None:
        self.victim = victim
        self.gate = gate
        self.free_chunks = free_chunks
        self.restart = restart
        self.restart_after_s = restart_after_s
        self.restarted: LocalTritonServer | None = None
        self.killed = threading.Event()
        self.killed_at = 0.0
        self._stop = threading.Event()
        self._thread = CheckedThread(self._watch, name="kill-mid-run")

    def start(self) -> "KillMidRun":
        self._thread.start()
        return self

    def _free_chunks_done(self) -> bool:
        return all(os.path.exists(os.path.join(self.gate, f"done-{index}"))
                   for index in range(self.free_chunks))

    def _watch(self) -> None:
        import time

        try:
            wait_for(lambda: self._stop.is_set() or self._free_chunks_done(), WATCH_TIMEOUT_S,
                     f"the run's first {self.free_chunks} chunks", interval=POLL_S)
            if not self._stop.is_set():
                assert self.victim.pid is not None
                os.kill(self.victim.pid, signal.SIGKILL)
                self.killed_at = time.time()
                self.killed.set()
        finally:
            # held chunks go on whatever happened here: a failure shows in the test, not a hang
            with open(os.path.join(self.gate, "killed"), "w"):
                pass
        if self.restart is not None and self.killed.is_set():
            # the outage's length is the scenario itself (a server back after a while)
            self._stop.wait(self.restart_after_s)
            self.restarted = self.restart()

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> None:
        self._thread.finish(timeout=120)
