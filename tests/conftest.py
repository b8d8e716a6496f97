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


@pytest.fixture
def simapi():
    """An HTTP peer on 127.0.0.1 serving a simulated cluster with nodes n0 and n1 (`SimApiServer`),
    requiring a bearer token; a watch sends bookmarks every 0.2 s."""
    from shardsched.testing.simapi import SimApiServer
    from shardsched.sim.cluster import SimCluster

    from builders import node

    sim = SimCluster()
    sim.create_nodes([node("n0"), node("n1")])
    with SimApiServer(sim, token="tok-" + uuid.uuid4().hex, bookmark_s=0.2) as srv:
        yield srv


@pytest.fixture
def simapi_spec(simapi, tmp_path):
    """A `ClientSpec` for `simapi` (no rate limit, 5 s request timeout)."""
    from shardsched.kube.client import ClientSpec

    return ClientSpec(kubeconfig=simapi.write_kubeconfig(str(tmp_path / "kc")), qps=0, request_timeout_s=5)
