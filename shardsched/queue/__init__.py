"""The scheduling queue of one shard: kube-scheduler's PriorityQueue (activeQ, backoffQ,
unschedulable pods), popped in batches, with an injectable clock."""

from shardsched.queue.clock import Clock, FakeClock, RealClock
from shardsched.queue.scheduling_queue import (
    ACTIVE_Q,
    ASSIGNED_POD_DELETE,
    BACKOFF_COMPLETE,
    BACKOFF_Q,
    GATED,
    NAMESPACE_UPDATE,
    NODE_ADD,
    NODE_UPDATE,
    POD_ADD,
    POD_UPDATE,
    SCHEDULE_ATTEMPT_FAILURE,
    SPREAD_SELECTOR_UPDATE,
    UNSCHEDULABLE_Q,
    UNSCHEDULABLE_TIMEOUT,
    QueuedPodInfo,
    SchedulingQueue,
)

__all__ = [
    "ACTIVE_Q",
    "ASSIGNED_POD_DELETE",
    "BACKOFF_COMPLETE",
    "BACKOFF_Q",
    "GATED",
    "NAMESPACE_UPDATE",
    "NODE_ADD",
    "NODE_UPDATE",
    "POD_ADD",
    "POD_UPDATE",
    "SCHEDULE_ATTEMPT_FAILURE",
    "SPREAD_SELECTOR_UPDATE",
    "UNSCHEDULABLE_Q",
    "UNSCHEDULABLE_TIMEOUT",
    "Clock",
    "FakeClock",
    "QueuedPodInfo",
    "RealClock",
    "SchedulingQueue",
]
