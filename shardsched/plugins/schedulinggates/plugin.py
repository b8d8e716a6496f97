"""SchedulingGates: a pod with ``spec.schedulingGates`` is not queued (kube's SchedulingGates).

Its PreEnqueue rejects the pod as UnschedulableAndUnresolvable while any gate is left; the pod
waits outside the queue (no scheduling attempt, no FailedScheduling Event) until an update removes
the last gate. Gates can only be removed after the pod's creation, never added.
"""

from __future__ import annotations

from shardsched.api.objects import PodInfo
from shardsched.framework.interface import PreEnqueuePlugin
from shardsched.framework.status import Status

NAME = "SchedulingGates"


class SchedulingGates(PreEnqueuePlugin):
    name = NAME

    def pre_enqueue(self, pod: PodInfo) -> Status:
        """Success without gates; else UnschedulableAndUnresolvable ``waiting for scheduling gates:
        [a b]`` (upstream's message: the gate names in order, as Go prints a string slice)."""
        if not pod.scheduling_gates:
            return Status.success()
        return Status.unschedulable(f"waiting for scheduling gates: [{' '.join(pod.scheduling_gates)}]",
                                    plugin=NAME, resolvable=False)


def new(args=None) -> SchedulingGates:
    return SchedulingGates()
