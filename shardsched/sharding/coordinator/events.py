"""What the coordinator writes to the cluster about a pod it could not schedule: FailedScheduling
Events and the PodScheduled condition, as kube-scheduler's FailureHandler writes them."""

from __future__ import annotations

from typing import Any, Mapping

from shardsched.api.objects import PodInfo
from shardsched.sharding.coordinator.state import CoordinatorState, Tracked

#: the condition kube's API server gives a pod created with scheduling gates (its pod strategy's
#: ``applySchedulingGatedCondition``), unless the pod already has a PodScheduled condition
SCHEDULING_GATED_CONDITION = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                              "message": "Scheduling is blocked due to non-empty scheduling gates"}


def mark_gated(state: CoordinatorState, pod: PodInfo, obj: Mapping[str, Any]) -> None:
    """PodScheduled=False with reason SchedulingGated, for a pod first held by PreEnqueue that has no
    PodScheduled condition yet (an API server before kube 1.26, a simulated cluster)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "PodScheduled" for c in conditions):
        state.cluster.set_pod_condition(pod.namespace, pod.name, dict(SCHEDULING_GATED_CONDITION))


def record_unschedulable(state: CoordinatorState, t: Tracked, message: str, write: bool = True) -> None:
    """PodScheduled=False and a FailedScheduling Event with kube's message over all nodes; after
    maxSchedulingAttempts rounds, the alert metric and a Warning event as well. ``write`` False:
    the Event and the condition are left to the caller (a preemptor's go with its nomination,
    `shardsched.cluster.preemption.Candidate`)."""
    pod = t.pod
    t.message = message
    ref = {"kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
    if write:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        state.cluster.record_event(ref, "Warning", "FailedScheduling", message)
        state.cluster.set_pod_condition(pod.namespace, pod.name, condition)
    state.counters["unschedulable_attempts"] += 1
    if t.rounds >= state.config.max_scheduling_attempts and not t.gave_up:
        t.gave_up = True
        state.metrics.unschedulable_alerts.inc()
        state.counters["gave_up"] += 1
        state.cluster.record_event(ref, "Warning", "FailedScheduling",
                           f"still unschedulable after {t.rounds} scheduling attempts (the pod is kept and "
                           f"retried on cluster events or after {state.config.pod_max_in_unschedulable_s:.0f} s): "
                           f"{message}")


def fail_pod(state: CoordinatorState, obj: dict, message: str) -> None:
    """A pod whose spec cannot be scheduled at all (it does not parse): FailedScheduling and
    PodScheduled=False with reason ``SchedulerError``, as kube-scheduler's handleSchedulingFailure
    reports a status that is an error rather than a rejection (``Unschedulable``)."""
    meta = obj.get("metadata") or {}
    ref = {"kind": "Pod", "namespace": meta.get("namespace") or "default", "name": meta.get("name"),
           "uid": meta.get("uid")}
    state.cluster.record_event(ref, "Warning", "FailedScheduling", message)
    state.cluster.set_pod_condition(ref["namespace"], ref["name"],
                       {"type": "PodScheduled", "status": "False", "reason": "SchedulerError", "message": message})
    state.counters["invalid"] += 1
