"""Shared fixtures. Redis tests run against a real redis-server (never a fake): one private
server per test session, and a ledger with a fresh key prefix per test, so tests neither see each
other's keys nor need a flush."""

from __future__ import annotations

import uuid
from typing import Iterator

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
