"""Shared fixtures. Redis tests run against a real redis-server (never a fake): one private
server per test session, and a ledger with a fresh key prefix per test, so tests neither see each
other's keys nor need a flush. Ray tests share one local Ray instance, started the first time a
test asks for it (`ray_session`) and shut down at the end of the session."""

from __future__ import annotations

import logging
import uuid
from typing import Any, Iterator

import pytest
import redis

from shardsched.store import EmbeddedRedis, Ledger, connect


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One `EmbeddedRedis` for the whole session (no AOF); stopped at the end."""
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = connect(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def ledger(redis_client: redis.Redis) -> Ledger:
    """A `Ledger` on the session's server with a key prefix unique to this test."""
    return Ledger(redis_client, prefix=f"test-{uuid.uuid4().hex[:12]}:")


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray for the whole session (2 CPUs, no dashboard): the ``ray`` module, initialized.

    Starting Ray costs seconds, so every Ray test shares this one; code under test must not shut
    down a Ray it did not start. Shut down at the end of the session.
    """
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             logging_level=logging.WARNING)
    try:
        yield ray
    finally:
        ray.shutdown()
