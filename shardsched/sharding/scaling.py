"""Horizontal shard scaling: the report of one step, and the optional autoscaler's policy.

`Coordinator.scale` carries out a step (see its docstring for the handover); this module holds what
is plain data or plain arithmetic, so that it is tested without Redis or Ray:

- `ScaleStep`: what one step did: shards before and after, the epoch it published, how many nodes
  changed owner next to the ideal, how many queued pods were routed again, how long it took.
- `Autoscaler`: the shard count from the load the shards report in `Shard.snapshot` (pods waiting
  in activeQ, backoffQ or in flight, and the recent creation -> bound latency), between a minimum and
  a maximum, with a cool-down after each change and a scale-down stabilization window, as
  Kubernetes' HorizontalPodAutoscaler does for replicas (``behavior.scaleDown.stabilizationWindowSeconds``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

#: the coordinator's Ray actor name and namespace in ``run`` and ``serve``, for ``shardsched scale``
COORDINATOR_NAME = "shardsched-coordinator"
RAY_NAMESPACE = "shardsched"


def ideal_moved_fraction(before: int, after: int, removed_share: float = 0.0) -> float:
    """The fraction of nodes that must change owner when the shard count goes from ``before`` to
    ``after``: for growth ``1 - before/after`` (the new shards' fair share; rendezvous hashing with
    bounded loads moves about that); for shrinking, the share of the nodes the removed shards owned
    (``removed_share``, in [0, 1]; about ``1 - after/before`` when the shards were even).

    Raises:
        ValueError: a count below 1.
    """
    if before < 1 or after < 1:
        raise ValueError(f"shard counts must be >= 1, got {before} -> {after}")
    if after >= before:
        return 1.0 - before / after
    return removed_share


@dataclass
class ScaleStep:
    """One run-time change of the shard count (`Coordinator.scale`).

    Attributes:
        from_shards, to_shards: shard count before and after.
        trigger: who asked: ``api`` (``shardsched scale``, ``--scale-at``) or ``autoscaler``.
        epoch: the shard-map epoch the step published.
        started_unix_s: when the step started (Unix seconds).
        start_s: seconds spent starting the new shard actors (waiting until they answer).
        handover_s: seconds of the handover itself (publish, hand the nodes over, drain, route).
        nodes: nodes in the cluster.
        nodes_moved: nodes whose owner changed.
        moved_fraction: nodes_moved / nodes.
        ideal_fraction: `ideal_moved_fraction` (growth: 1 - from/to; shrinking: removed_share).
        removed_share: fraction of the nodes the removed shards owned (0 for growth).
        pods_rerouted: queued pods drained from shards and routed again.
        pods_in_flight: pods of removed shards neither queued nor seen bound when the shards
            stopped: in their last batch, or bound and not yet on the coordinator's watch. They are
            resolved by the watch or the rebalancer within moments; any that is not by
            `Coordinator.handover_grace_s` is routed again then.
    """

    from_shards: int
    to_shards: int
    trigger: str
    epoch: int
    started_unix_s: float
    start_s: float = 0.0
    handover_s: float = 0.0
    nodes: int = 0
    nodes_moved: int = 0
    moved_fraction: float = 0.0
    ideal_fraction: float = 0.0
    removed_share: float = 0.0
    pods_rerouted: int = 0
    pods_in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("start_s", "handover_s", "moved_fraction", "ideal_fraction", "removed_share"):
            out[k] = round(out[k], 4)
        return out


@dataclass
class AutoscalerOptions:
    """Bounds and targets of the autoscaler; the defaults are explained per field.

    Attributes:
        min_shards: never fewer shards (default 1: one shard serves a quiet cluster).
        max_shards: never more (default 8). On a Ray cluster where every shard declares a CPU
            (``shard_num_cpus``), set it to what the workers can offer: Ray's maxReplicas x CPUs per
            worker (the overlays in deploy/ say so); beyond it new shards would wait for ever.
        target_pending_per_shard: pods waiting (activeQ, backoffQ, in flight; not those known
            unschedulable, which more shards do not help) per shard that the count is sized for
            (default 2000): two full batches (``max_batch_size`` 1000), about one second of one
            shard's work on this machine; a deeper queue means pods wait for a shard while another
            could serve them.
        target_latency_s: recent creation -> bound latency (the worst shard's P90 over the last
            10 s) above which one more shard is added while pods wait, whatever the queue depth says
            (default 5 s: the field report's kube-scheduler had a P99 of 4 s).
        cooldown_s: no change within this long after the previous one (default 15 s): new shards
            take a second or two to start on a warm Ray node, then the queues redistribute and the
            latency window fills with pods scheduled by the new count before it is judged again.
        scale_down_delay_s: scale down only to the highest count recommended during this window
            (default 60 s; HPA's scale-down stabilization window, 300 s there: a shard restarts in
            seconds, a pod's image may take minutes). Bursts that come every minute keep their shards.
        period_s: how often the coordinator asks the shards for their load (default 2 s).
    """

    min_shards: int = 1
    max_shards: int = 8
    target_pending_per_shard: int = 2000
    target_latency_s: float = 5.0
    cooldown_s: float = 15.0
    scale_down_delay_s: float = 60.0
    period_s: float = 2.0

    def __post_init__(self) -> None:
        if self.min_shards < 1:
            raise ValueError(f"min_shards must be >= 1, got {self.min_shards}")
        if self.max_shards < self.min_shards:
            raise ValueError(f"max_shards ({self.max_shards}) must be >= min_shards ({self.min_shards})")
        if self.target_pending_per_shard < 1:
            raise ValueError(f"target_pending_per_shard must be >= 1, got {self.target_pending_per_shard}")
        for name in ("target_latency_s", "period_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("cooldown_s", "scale_down_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def clip(self, n: int) -> int:
        return max(self.min_shards, min(self.max_shards, n))


@dataclass(frozen=True)
class Load:
    """What the autoscaler reads from the shards.

    Attributes:
        shards: current shard count.
        pending: pods waiting in the shards (activeQ + backoffQ + in flight), summed.
        latency_p90_s: the worst shard's P90 creation -> bound latency over the recent window, or
            None when no shard bound a pod in it.
    """

    shards: int
    pending: int
    latency_p90_s: float | None

    @classmethod
    def of(cls, shards: int, snapshots: Iterable[dict]) -> "Load":
        """From `Shard.snapshot` dicts (shards that did not answer are left out)."""
        pending, latency = 0, None
        for snap in snapshots:
            counts = snap.get("pending") or {}
            pending += int(counts.get("active", 0)) + int(counts.get("backoff", 0)) + int(snap.get("in_flight", 0))
            p90 = snap.get("latency_p90_s")
            if p90 is not None:
                latency = p90 if latency is None else max(latency, p90)
        return cls(shards, pending, latency)


class Autoscaler:
    """The shard-count policy (pure: no I/O; the coordinator feeds it `Load` and carries out what
    it decides).

    Recommendation: ``ceil(pending / target_pending_per_shard)``, or one more than now when pods
    wait and the latency is over its target, within [min_shards, max_shards]. A count outside the
    bounds is corrected at once; otherwise nothing changes within ``cooldown_s`` of the last change;
    a higher recommendation is followed at once, a lower one only down to the highest
    recommendation of the last ``scale_down_delay_s`` and only once that window has been observed
    since the start or the last change.

    Args:
        options: bounds and targets.
        clock: monotonic seconds (``time.monotonic``; a fake clock in tests).
    """

    def __init__(self, options: AutoscalerOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock
        self._history: deque[tuple[float, int]] = deque()  # (time, recommendation)
        self._started = clock()
        self._last_change: float | None = None

    def recommend(self, load: Load) -> int:
        """The count this load alone asks for, within the bounds."""
        o = self.options
        n = math.ceil(load.pending / o.target_pending_per_shard)
        if load.pending > 0 and load.latency_p90_s is not None and load.latency_p90_s > o.target_latency_s:
            n = max(n, load.shards + 1)
        return o.clip(n)

    def decide(self, load: Load) -> int | None:
        """The count to scale to now, or None to keep the current one. Records the recommendation."""
        o = self.options
        now = self.clock()
        rec = self.recommend(load)
        self._history.append((now, rec))
        while self._history and self._history[0][0] < now - o.scale_down_delay_s:
            self._history.popleft()
        if o.clip(load.shards) != load.shards:
            return o.clip(load.shards)
        if self._last_change is not None and now - self._last_change < o.cooldown_s:
            return None
        if rec > load.shards:
            return rec
        observed_since = self._started if self._last_change is None else self._last_change
        if rec < load.shards and now - observed_since >= o.scale_down_delay_s:
            target = max(r for _, r in self._history)
            if target < load.shards:
                return target
        return None

    def changed(self) -> None:
        """The shard count changed (by this policy or by an operator): restart the cool-down."""
        self._last_change = self.clock()
