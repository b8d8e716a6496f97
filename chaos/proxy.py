"""A TCP proxy on 127.0.0.1 whose faults the chaos runner controls: added latency and partitions.

Shards reach Redis through it (their ``--redis-url`` points at the proxy), so a scenario can delay
every byte between shards and Redis, or cut the connection, without touching anything else on the
machine. Runs its own asyncio loop in a daemon thread; every method is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``target_host:target_port``.

    Args:
        latency_s: delay added to each chunk in each direction (seconds).

    ``partition()`` closes every open connection and refuses new ones (connections are accepted and
    closed at once, like a peer that resets) until ``heal()``.
    """

    def __init__(self, target_host: str, target_port: int, latency_s: float = 0.0) -> None:
        self.target = (target_host, target_port)
        self.latency_s = latency_s
        self.partitioned = False
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self.connections = 0
        self.refused = 0

    # ------------------------------------------------------------------ control (any thread)
    def start(self) -> "FaultProxy":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def set_latency(self, seconds: float) -> None:
        self.latency_s = max(0.0, seconds)

    def partition(self) -> None:
        """Cut: close open connections, refuse new ones."""
        self.partitioned = True
        asyncio.run_coroutine_threadsafe(self._close_all(), self._loop).result(10)

    def heal(self) -> None:
        self.partitioned = False

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def url_for(self, redis_url: str) -> str:
        """``redis_url`` with its host:port replaced by the proxy's."""
        host_port = f"{self.target[0]}:{self.target[1]}"
        if host_port not in redis_url:
            raise ValueError(f"{redis_url!r} does not point at {host_port}")
        return redis_url.replace(host_port, f"127.0.0.1:{self.port}")

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.partitioned:
            self.refused += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.connections += 1
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not self.partitioned:
                data = await reader.read(65536)
                if not data:
                    break
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                if self.partitioned:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _close_all(self) -> None:
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def _shutdown(self) -> None:
        await self._close_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def measure_ping_s(client, n: int = 5) -> float:
    """Median round trip of ``client.ping()`` in seconds (for tests and the runner's checks)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.ping()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]
