"""PrioritySort: higher ``spec.priority`` first, then earlier time of entry into the queue
(kube's PrioritySort QueueSort plugin); equal entries keep insertion order."""

from __future__ import annotations

from shardsched.api.objects import PodInfo
from shardsched.framework.interface import QueueSortPlugin

NAME = "PrioritySort"


class PrioritySort(QueueSortPlugin):
    name = NAME

    def sort_key(self, pod: PodInfo, timestamp: float, seq: int) -> tuple:
        return (-pod.priority, timestamp, seq)


def new(args=None) -> PrioritySort:
    return PrioritySort()
