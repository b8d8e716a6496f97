"""Coscheduling: a PodGroup's pods are placed all or nothing (scheduler-plugins' Coscheduling,
v0.34), at QueueSort, PreFilter, Reserve/Unreserve and Permit.

- **QueueSort**: higher priority first; then the group's creation time (a pod without a group: its
  own creation time), so a gang's members leave the queue together; then the group's
  ``namespace/name`` and the pod's queue time. Upstream breaks a tie of creation times by the
  pod's ``namespace/name``, which interleaves two gangs created in the same second (creation
  times have second precision); the group's name first keeps each gang together.
- **PreFilter** rejects (UnschedulableAndUnresolvable, upstream's words) a member whose group does
  not exist or is invalid (upstream rejects it at Permit, once reserved; here nothing is reserved
  for a pod that cannot bind), whose group has fewer than ``minMember`` pods, or fewer ungated
  pods than that, or whose ``minResources`` (with ``pods: minMember``) exceed the free capacity
  of the nodes, the group's own pods' requests counted as free, as upstream's
  ``CheckClusterResource``.
- **Permit**: a member waits (``scheduleTimeoutSeconds``, else ``permitWaitingTimeSeconds``) until
  the group's bound plus assigned (reserved, held at Permit) members reach ``minMember``; the
  member that completes the quorum allows its waiting siblings. The members of one binding-cycle
  batch are assigned together, so a gang reserved in one batch passes at once.
- **Unreserve** (any member rolled back) rejects the group's waiting members, as upstream: the
  gang goes back as a unit.

Over a partial view (a shard's table, ``partial_view``) the plugin lets every pod through
(PreFilter Success, Permit Allow, Unreserve nothing): in the sharded runtime the coordinator
decides a whole gang over the whole cluster and holds it in the ledger before any member reaches a
shard (`shardsched.sharding.coordinator.gangs`), as it nominates the pods whose constraints need
the whole cluster.

``podGroupBackoffSeconds`` (`pod_group_backoff_s`): a group that could not be placed whole, with
at least ``minMember`` pods, is not tried again for that long (upstream's "podGroup ... failed
recently"); the sharded runtime's coordinator, which decides whole gangs, applies it
(`shardsched.sharding.coordinator.gangs`).

Not implemented: upstream's PostFilter (it rejects the waiting siblings of a member that fits no
node; here a gang is decided as one, ``docs/gangs.md``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from shardsched.api.objects import PodInfo, parse_time
from shardsched.api.quantity import format_quantity
from shardsched.cache.node_table import NodeTable
from shardsched.errors import InvalidObjectError
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import (ALLOW, Handle, PermitPlugin, PreFilterPlugin, QueueSortPlugin,
                                            ReservePlugin)
from shardsched.framework.status import Code, Status

NAME = "Coscheduling"
#: upstream's default ``permitWaitingTimeSeconds``
DEFAULT_PERMIT_WAITING_TIME_S = 60


def _created_s(pod: PodInfo) -> float:
    try:
        return parse_time(pod.creation_timestamp, "metadata.creationTimestamp") or 0.0
    except InvalidObjectError:
        return 0.0


class Coscheduling(QueueSortPlugin, PreFilterPlugin, ReservePlugin, PermitPlugin):
    """The plugin over the `Handle`'s `PodGroupCache` (module docstring).

    Args:
        handle: the framework's; its ``pod_groups`` are the groups and members, its waiting pods
            the members held at Permit.
        permit_waiting_time_s: the wait at Permit of a group without ``scheduleTimeoutSeconds``.
        partial_view: the framework's table holds only part of the cluster (module docstring).
        pod_group_backoff_s: ``podGroupBackoffSeconds`` (0: none; module docstring).
    """

    name = NAME

    def __init__(self, handle: Handle, permit_waiting_time_s: int = DEFAULT_PERMIT_WAITING_TIME_S,
                 partial_view: bool = False, pod_group_backoff_s: int = 0) -> None:
        self.handle = handle
        self.groups = handle.pod_groups
        self.permit_waiting_time_s = permit_waiting_time_s
        self.partial_view = partial_view
        self.pod_group_backoff_s = pod_group_backoff_s

    # ------------------------------------------------------------------ QueueSort
    def sort_key(self, pod: PodInfo, timestamp: float, seq: int) -> tuple:
        key, group = self.groups.group_of(pod)
        if group is not None:
            return (-pod.priority, group.created_s, key, timestamp, seq)
        return (-pod.priority, _created_s(pod), pod.key, timestamp, seq)

    # ------------------------------------------------------------------ PreFilter
    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> Status:
        """Success for a pod without a group or whose group may start; else the rejection
        (module docstring), UnschedulableAndUnresolvable."""
        key, group = self.groups.group_of(pod)
        if key is None or self.partial_view:
            return Status.success()
        if group is None:
            why = self.groups.invalid.get(key)
            return self._reject(f"PodGroup {key} is invalid: {why}" if why else f"PodGroup {key} not found")
        count, gated = self.groups.counts(key)
        if count < group.min_member:
            return self._reject(f"pre-filter pod {pod.name} cannot find enough sibling pods, current pods number: "
                                f"{count}, minMember of group: {group.min_member}")
        if count - gated < group.min_member:
            return self._reject(f"pre-filter pod {pod.name} cannot proceed due to gated pods in the same PodGroup")
        want = group.min_resources_with_pods()
        if want:
            gap = self._resource_gap(want, self.groups.members(key), table)
            if gap:
                return self._reject(f"PodGroup {key} resource gap: " +
                                    ", ".join(f"{r} {format_quantity(r, v)}" for r, v in sorted(gap.items())))
        return Status.success()

    @staticmethod
    def _resource_gap(want: dict[str, int], members: list[PodInfo], table: NodeTable) -> dict[str, int]:
        """What ``want`` exceeds the nodes' free capacity by (resource -> amount; empty: it fits),
        the requests of the group's pods counted on the table taken as free."""
        valid = table.valid_slots()
        counted = [m for m in members if m.uid in table.pod_slot]
        gap = {}
        for r, v in want.items():
            free = int(np.maximum(table.free(r)[valid], 0).sum()) if r in table.res_index else 0
            free += sum(m.requests.get(r, 0) for m in counted)
            if v > free:
                gap[r] = v - free
        return gap

    @staticmethod
    def _reject(message: str) -> Status:
        return Status.unschedulable(message, plugin=NAME, resolvable=False)

    # ------------------------------------------------------------------ Reserve
    def reserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        """Nothing to hold (as upstream); Success for every pod."""
        return [Status.success()] * len(pods)

    def unreserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        """The pods are no longer assigned, and every waiting member of their groups is rejected
        (``rejection in Unreserve``): the gang goes back as a unit. Idempotent."""
        by_group = {} if self.partial_view else self._by_group(pods)
        for key, uids in by_group.items():
            self.groups.unassign(key, uids)
        if by_group:
            self.handle.iterate_over_waiting_pods(
                lambda wp: wp.reject(NAME, "rejection in Unreserve")
                if self.groups.group_of(wp.pod)[0] in by_group else None)

    # ------------------------------------------------------------------ Permit
    def permit(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[tuple[Status, float]]:
        """Per pod: Allow without a group; Unschedulable ``PodGroup not found``; Allow (and its
        waiting siblings) once bound + assigned members reach ``minMember``; else Wait with the
        group's timeout."""
        if self.partial_view:
            return [ALLOW] * len(pods)
        by_group = self._by_group(pods)
        placed = {key: self.groups.assign(key, uids) for key, uids in by_group.items()}
        out = []
        for pod in pods:
            key, group = self.groups.group_of(pod)
            if key is None:
                out.append(ALLOW)
            elif group is None:
                out.append((Status.unschedulable("PodGroup not found", plugin=NAME), 0.0))
            elif placed[key] >= group.min_member:
                out.append(ALLOW)
            else:
                timeout = group.schedule_timeout_s
                out.append((Status(Code.WAIT, (), NAME), float(self.permit_waiting_time_s if timeout is None
                                                             else timeout)))
        complete = {key for key, n in placed.items() if (g := self.groups.groups.get(key)) and n >= g.min_member}
        if complete:
            self.handle.iterate_over_waiting_pods(
                lambda wp: wp.allow(NAME) if self.groups.group_of(wp.pod)[0] in complete else None)
        return out

    def _by_group(self, pods: Sequence[PodInfo]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in pods:
            key = self.groups.group_of(p)[0]
            if key is not None:
                out.setdefault(key, []).append(p.uid)
        return out


def new(args, partial_view: bool, handle: Handle) -> Coscheduling:
    if args is None:
        return Coscheduling(handle, DEFAULT_PERMIT_WAITING_TIME_S, partial_view)
    return Coscheduling(handle, args.permit_waiting_time_seconds, partial_view, args.pod_group_backoff_seconds)
