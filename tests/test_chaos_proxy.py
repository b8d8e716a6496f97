"""The chaos suite's TCP fault proxy in front of a real Redis."""

from __future__ import annotations

import pytest
import redis

from chaos.proxy import FaultProxy, measure_ping_s
from shardsched.store.server import connect


@pytest.fixture
def proxy(redis_server):
    with FaultProxy("127.0.0.1", redis_server.port) as p:
        yield p


def test_forwards_and_adds_latency(redis_server, proxy):
    client = connect(proxy.url_for(redis_server.url), retries=0)
    assert client.ping()
    base = measure_ping_s(client)
    proxy.set_latency(0.05)
    slow = measure_ping_s(client)
    assert slow >= 0.1 > base  # 50 ms each way


def test_partition_cuts_and_heal_restores(redis_server, proxy):
    client = connect(proxy.url_for(redis_server.url), timeout_s=1.0, connect_timeout_s=0.5, retries=0)
    assert client.ping()
    proxy.partition()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.ping()
    assert proxy.refused >= 1
    proxy.heal()
    assert client.ping()


def test_url_for_rejects_another_target(proxy):
    with pytest.raises(ValueError):
        proxy.url_for("redis://127.0.0.1:1/0")
