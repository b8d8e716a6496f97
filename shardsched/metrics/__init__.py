"""Prometheus metrics with kube-scheduler's names and labels under a ``shardsched_`` prefix.

kube-scheduler's metrics (``scheduler_schedule_attempts_total{result,profile}``,
``scheduler_scheduling_attempt_duration_seconds{result,profile}``,
``scheduler_pod_scheduling_sli_duration_seconds{attempts}``, ``scheduler_pending_pods{queue}``,
``scheduler_framework_extension_point_duration_seconds{extension_point,status,profile}``) become
``shardsched_scheduler_...``; shardsched adds ledger, lease, rebalancer and shard metrics. No pod or
node names are used as labels.

Every shard is a separate process with its own `ShardMetrics` (a private registry). The process that
serves ``/metrics`` pulls each shard's samples (`ShardMetrics.samples`) and exposes them with a
``shard`` label through `AggregateCollector`.
"""

from __future__ import annotations

from typing import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client import Histogram as _Histogram
from prometheus_client import disable_created_metrics, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# kube-scheduler exposes no *_created series; neither do we (and they would not aggregate)
disable_created_metrics()

PREFIX = "shardsched_"
#: kube-scheduler's buckets for scheduling_attempt_duration_seconds (exponential from 1 ms)
ATTEMPT_BUCKETS = tuple(0.001 * 2**i for i in range(15))
#: kube-scheduler's buckets for pod_scheduling_sli_duration_seconds (exponential from 10 ms)
SLI_BUCKETS = tuple(0.01 * 2**i for i in range(20))
EXTENSION_BUCKETS = tuple(0.0001 * 2**i for i in range(12))

class _CachedLabels:
    """``labels(*values)`` memoized per label tuple: prometheus_client validates and locks on every
    call, which showed up at 5-14% of a shard's CPU when called per pod."""

    def labels(self, *values: str):  # type: ignore[override]
        cache = self.__dict__.setdefault("_child_cache", {})
        child = cache.get(values)
        if child is None:
            child = cache[values] = super().labels(*values)  # type: ignore[misc]
        return child


class Counter(_CachedLabels, _Counter):
    pass


class Gauge(_CachedLabels, _Gauge):
    pass


class Histogram(_CachedLabels, _Histogram):
    pass


# result label values, as kube-scheduler
SCHEDULED, UNSCHEDULABLE, ERROR = "scheduled", "unschedulable", "error"


class ShardMetrics:
    """The metrics of one shard (or of the coordinator), in a private registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.schedule_attempts = Counter(
            PREFIX + "scheduler_schedule_attempts_total",
            "Number of attempts to schedule pods, by the result (scheduled, unschedulable, error).",
            ["result", "profile"], registry=r)
        self.attempt_duration = Histogram(
            PREFIX + "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding), per pod.",
            ["result", "profile"], buckets=ATTEMPT_BUCKETS, registry=r)
        self.podgroup_attempts = Counter(
            PREFIX + "scheduler_podgroup_schedule_attempts_total",
            "Number of attempts to schedule a whole pod group (gang), by the result (scheduled, "
            "unschedulable, error).", ["result"], registry=r)
        self.podgroup_attempt_duration = Histogram(
            PREFIX + "scheduler_podgroup_scheduling_attempt_duration_seconds",
            "Latency of an attempt to schedule a whole pod group: its members' decisions and its one "
            "ledger call.", ["result"], buckets=ATTEMPT_BUCKETS, registry=r)
        self.sli_duration = Histogram(
            PREFIX + "scheduler_pod_scheduling_sli_duration_seconds",
            "E2e latency for a pod being scheduled, from the time it entered the queue (or was created).",
            ["attempts"], buckets=SLI_BUCKETS, registry=r)
        self.pending_pods = Gauge(
            PREFIX + "scheduler_pending_pods",
            "Number of pending pods, by the queue type (active, backoff, unschedulable, gated).",
            ["queue"], registry=r)
        self.extension_point_duration = Histogram(
            PREFIX + "scheduler_framework_extension_point_duration_seconds",
            "Latency for running all plugins of a specific extension point, per batch.",
            ["extension_point", "status", "profile"], buckets=EXTENSION_BUCKETS, registry=r)
        self.ledger_reserve = Counter(
            PREFIX + "ledger_reserve_total", "Pods reserved in the Redis ledger, by result code.", ["code"], registry=r)
        self.ledger_permit = Counter(
            PREFIX + "ledger_permit_total",
            "Pods checked in the Redis ledger right before binding (Permit), by result code.", ["code"], registry=r)
        self.ledger_calls = Histogram(
            PREFIX + "ledger_call_duration_seconds", "Latency of Redis ledger calls.", ["op"],
            buckets=EXTENSION_BUCKETS, registry=r)
        self.leases = Counter(
            PREFIX + "lease_acquire_total",
            "Pod lease acquisitions, by result (acquired, held_elsewhere; lost: gone before binding).",
            ["result"], registry=r)
        self.binds = Counter(
            PREFIX + "bind_total", "Bind calls, by result (ok, conflict, not_found, error).", ["result"], registry=r)
        self.requeues = Counter(
            PREFIX + "rebalancer_requeues_total", "Pods sent back by the rebalancer, by reason.", ["reason"], registry=r)
        self.unschedulable_alerts = Counter(
            PREFIX + "unschedulable_pods_total",
            "Pods given up on after the maximum number of attempts (PodScheduled=False, Unschedulable).",
            registry=r)
        self.batch_size = Histogram(
            PREFIX + "shard_batch_size", "Pods per scheduling batch.", buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
            registry=r)
        self.nodes = Gauge(PREFIX + "shard_nodes", "Nodes owned by the shard.", registry=r)
        # kube-scheduler's preemption metrics (the coordinator's: it preempts over the whole cluster)
        self.preemption_attempts = Counter(
            PREFIX + "scheduler_preemption_attempts_total", "Total preemption attempts in the cluster till now",
            registry=r)
        self.preemption_victims = Histogram(
            PREFIX + "scheduler_preemption_victims", "Number of selected preemption victims",
            buckets=tuple(2**i for i in range(7)), registry=r)
        self.preemption_evaluation = Histogram(
            PREFIX + "scheduler_preemption_evaluation_duration_seconds",
            "Latency of one preemption evaluation (DefaultPreemption's PostFilter over the whole cluster), seconds.",
            buckets=ATTEMPT_BUCKETS, registry=r)

    def samples(self) -> list[tuple[str, str, str, list[tuple[str, dict, float]]]]:
        """Plain snapshot (picklable): [(family name, type, help, [(sample name, labels, value)])]."""
        out = []
        for family in self.registry.collect():
            out.append((family.name, family.type, family.documentation,
                        [(s.name, dict(s.labels), s.value) for s in family.samples]))
        return out


class AggregateCollector(Collector):
    """Exposes the samples of many shards under one registry, adding a ``shard`` label.

    Args:
        fetch: returns {shard id: ShardMetrics.samples()}; called at every scrape (errors of one
            shard drop that shard's samples from the scrape, never the whole scrape).
    """

    def __init__(self, fetch: Callable[[], dict[str, list]]) -> None:
        self.fetch = fetch

    def collect(self) -> Iterable:
        try:
            per_shard = self.fetch()
        except Exception:  # noqa: BLE001 - a scrape must never fail because a shard is away
            per_shard = {}
        families: dict[str, Metric] = {}
        for shard, fams in per_shard.items():
            for name, typ, doc, samples in fams:
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = Metric(name, doc, typ)
                for sname, labels, value in samples:
                    fam.add_sample(sname, {**labels, "shard": shard}, value)
        return list(families.values())


def serve(port: int, registry: CollectorRegistry, addr: str = "127.0.0.1") -> object:
    """Serve ``/metrics`` of ``registry`` on ``addr:port`` in a daemon thread.

    Raises:
        OSError: the port is in use (the caller reports it clearly).
    """
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server

