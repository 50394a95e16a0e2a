"""A TCP relay that adds a round-trip time: the kernel here has no netem, so a delay is user space.

How it works, with examples: docs/internals/netlab.md, "Rates and round trips".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import socket
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lab import Host
    from .processes import HostProcess

logger = logging.getLogger(__name__)

READ_BYTES = 256 * 1024
MIN_BUFFER_BYTES = 1 << 20
UNKNOWN_RATE_BUFFER_BYTES = 32 << 20


def relay_buffer_bytes(rtt_ms: float, rate_mbit: float | None) -> int:
    """Bytes one direction may hold: a round trip's worth at ``rate_mbit`` (32 MiB if unknown)."""
    if rate_mbit is None:
        return UNKNOWN_RATE_BUFFER_BYTES
    return max(MIN_BUFFER_BYTES, int(rate_mbit * 1e6 / 8 * rtt_ms / 1e3))


class _Direction:
    """One direction of one connection: read, hold for ``delay_s``, write."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 delay_s: float, cap: int) -> None:
        self.reader, self.writer = reader, writer
        self.delay_s, self.cap = delay_s, cap
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.held = 0
        self.more = asyncio.Event()     # something was queued (or the end)
        self.room = asyncio.Event()     # the queue is under its cap
        self.room.set()
        self.ended = False

    async def pump_in(self) -> None:
        try:
            while True:
                await self.room.wait()
                data = await self.reader.read(READ_BYTES)
                if not data:
                    break
                self.queue.append((time.monotonic() + self.delay_s, data))
                self.held += len(data)
                if self.held >= self.cap:
                    self.room.clear()
                self.more.set()
        finally:
            self.ended = True
            self.more.set()

    async def pump_out(self) -> None:
        while True:
            if not self.queue:
                if self.ended:
                    break
                self.more.clear()
                await self.more.wait()
                continue
            due, data = self.queue[0]
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self.queue.popleft()
            self.writer.write(data)
            await self.writer.drain()
            self.held -= len(data)
            if self.held < self.cap:
                self.room.set()
        if self.writer.can_write_eof():
            self.writer.write_eof()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _serve_connection(client_reader, client_writer, target: tuple[str, int],
                            delay_s: float, cap: int) -> None:
    try:
        server_reader, server_writer = await asyncio.open_connection(*target)
    except OSError as error:
        logger.warning("relay: cannot reach %s:%d: %s", *target, error)
        client_writer.close()
        return
    for writer in (client_writer, server_writer):
        _no_delay(writer)
    directions = (_Direction(client_reader, server_writer, delay_s, cap),
                  _Direction(server_reader, client_writer, delay_s, cap))
    tasks = [asyncio.ensure_future(part) for direction in directions
             for part in (direction.pump_in(), direction.pump_out())]
    try:
        await asyncio.gather(*tasks)
    except (ConnectionError, OSError):
        pass  # one side went away: close both, as a cable pulled at either end would
    finally:
        for task in tasks:
            task.cancel()
        for writer in (client_writer, server_writer):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int], rtt_ms: float,
                buffer_bytes: int) -> None:
    """Relay connections to ``listen`` onto ``target`` forever, adding ``rtt_ms`` per round trip."""
    delay_s = rtt_ms / 2e3

    async def handle(reader, writer):
        await _serve_connection(reader, writer, target, delay_s, buffer_bytes)

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    logger.info("relay %s:%d -> %s:%d, +%.1f ms round trip, %d bytes per direction", *listen,
                *target, rtt_ms, buffer_bytes)
    async with server:
        await server.serve_forever()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coffea_sonic.netlab.relay",
                                     description="TCP relay that adds a round-trip time")
    parser.add_argument("--listen", required=True, type=_address, metavar="IP:PORT")
    parser.add_argument("--target", required=True, type=_address, metavar="IP:PORT")
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--rate-mbit", type=float, default=None,
                        help="the link's rate, to size the held bytes (default: 32 MiB)")
    parser.add_argument("--buffer-bytes", type=int, default=None)
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cap = options.buffer_bytes or relay_buffer_bytes(options.rtt_ms, options.rate_mbit)
    try:
        asyncio.run(serve(options.listen, options.target, options.rtt_ms, cap))
    except KeyboardInterrupt:
        pass
    return 0


def start_relay(host: "Host", target: str, listen_port: int, *, rtt_ms: float | None = None,
                name: str | None = None) -> str:
    """Start a relay on ``host`` from ``host.ip:listen_port`` to ``target``; return its address.

    ``rtt_ms`` defaults to the host's ``Link.rtt_ms``; the held bytes follow the link's rate.
    The lab stops the relay with everything else.
    """
    link = host.link
    rtt = link.rtt_ms if rtt_ms is None else rtt_ms
    argv = [sys.executable, "-m", "coffea_sonic.netlab.relay", "--listen",
            f"0.0.0.0:{listen_port}", "--target", target, "--rtt-ms", str(rtt)]
    if link.rate_mbit is not None:
        argv += ["--rate-mbit", str(link.rate_mbit)]
    process: HostProcess = host.popen(argv, name=name or f"relay-{listen_port}")
    return process.wait_for_port(listen_port)


if __name__ == "__main__":
    sys.exit(main())
