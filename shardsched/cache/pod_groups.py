"""PodGroupCache: the PodGroups a scheduler knows and the pods that name each one, what
Coscheduling reads (upstream's PodGroup lister, pod lister and ``assignedPodsByPG``).

Whoever holds the cluster's view keeps it current: ``simulate`` from its manifests, the sharded
runtime from the watch (the coordinator). A pod joins the group of its
``scheduling.x-k8s.io/pod-group`` label in its namespace (`shardsched.api.podgroup.group_key_of`),
whether or not the group exists yet. Thread-safe (one lock): a binding cycle's Permit reads it
from another thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from shardsched.api.objects import PodInfo
from shardsched.api.podgroup import PodGroup, group_key_of


class PodGroupCache:
    """Groups by ``namespace/name``, the invalid ones with why, and each group's member pods.

    A member is *bound* once its ``spec.nodeName`` is set (the watch's truth, or a bound pod of the
    input; `bound` marks it) and *assigned* while a binding cycle holds it reserved (Permit until bind or Unreserve,
    as upstream's ``assignedPodsByPG``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.groups: dict[str, PodGroup] = {}
        self.invalid: dict[str, str] = {}
        self._members: dict[str, dict[str, PodInfo]] = {}
        self._group_of: dict[str, str] = {}
        self._assigned: dict[str, set[str]] = {}
        self._gated: dict[str, int] = {}  # group key -> members with scheduling gates
        self._bound: dict[str, set[str]] = {}  # group key -> uids of its bound members

    # ------------------------------------------------------------------ writes
    def set_groups(self, groups: Mapping[str, PodGroup], invalid: Mapping[str, str]) -> None:
        """Replace the groups and the invalid groups (after `apply_pod_group_events` or a list)."""
        with self._lock:
            self.groups = dict(groups)
            self.invalid = dict(invalid)

    def add_group(self, group: PodGroup) -> None:
        with self._lock:
            self.groups[group.key] = group
            self.invalid.pop(group.key, None)

    def add_pod(self, pod: PodInfo) -> str | None:
        """Record (or update) a pod; returns its group key, or None when it names no group. A pod
        that is terminal leaves its group (upstream counts pods by phase; a finished member no
        longer helps the gang start)."""
        key = group_key_of(pod.namespace, pod.labels)
        with self._lock:
            old = self._group_of.get(pod.uid)
            if old is not None and old != key:
                self._drop(pod.uid, old)
            if key is None or pod.terminal:
                if key is not None:
                    self._drop(pod.uid, key)
                return key
            members = self._members.setdefault(key, {})
            old_pod = members.get(pod.uid)
            self._gated[key] = self._gated.get(key, 0) + bool(pod.scheduling_gates) - bool(
                old_pod is not None and old_pod.scheduling_gates)
            members[pod.uid] = pod
            self._group_of[pod.uid] = key
            if pod.bound:
                self._bound.setdefault(key, set()).add(pod.uid)
            return key

    def bound(self, uid: str) -> bool:
        """A recorded member is bound (the watch says so; its spec is not parsed again). Returns
        False for a pod that is no member."""
        with self._lock:
            key = self._group_of.get(uid)
            if key is None:
                return False
            self._bound.setdefault(key, set()).add(uid)
            return True

    def is_member(self, uid: str) -> bool:
        with self._lock:
            return uid in self._group_of

    def remove_pod(self, uid: str) -> None:
        """Forget a pod (deleted); safe for any uid."""
        with self._lock:
            key = self._group_of.get(uid)
            if key is not None:
                self._drop(uid, key)

    def assign(self, key: str, uids: Iterable[str]) -> int:
        """Count these members as assigned (reserved, at Permit); returns the group's bound plus
        assigned members (only pods recorded with `add_pod` count)."""
        with self._lock:
            assigned = self._assigned.setdefault(key, set())
            assigned.update(uids)
            return self._placed(key)

    def unassign(self, key: str, uids: Iterable[str]) -> None:
        """No longer assigned (Unreserve, or bound: then the member counts as bound)."""
        with self._lock:
            assigned = self._assigned.get(key)
            if assigned is not None:
                assigned.difference_update(uids)
                if not assigned:
                    del self._assigned[key]

    # ------------------------------------------------------------------ reads
    def group_of(self, pod: PodInfo) -> tuple[str | None, PodGroup | None]:
        """(group key, group) of a pod: (None, None) without the label, (key, None) when the
        group does not exist (or is invalid: see `invalid`)."""
        key = group_key_of(pod.namespace, pod.labels)
        if key is None:
            return None, None
        with self._lock:
            return key, self.groups.get(key)

    def counts(self, key: str) -> tuple[int, int]:
        """(members, members with scheduling gates) of a group, O(1)."""
        with self._lock:
            return len(self._members.get(key, ())), self._gated.get(key, 0)

    def bound_count(self, key: str) -> int:
        """Members bound, O(1)."""
        with self._lock:
            return len(self._bound.get(key, ()))

    def members(self, key: str) -> list[PodInfo]:
        """The group's non-terminal pods, in no particular order."""
        with self._lock:
            return list(self._members.get(key, {}).values())

    def placed(self, key: str) -> int:
        """Members bound or assigned."""
        with self._lock:
            return self._placed(key)

    # ------------------------------------------------------------------ helpers
    def _placed(self, key: str) -> int:
        bound = self._bound.get(key, set())
        return len(bound) + len(self._assigned.get(key, set()) - bound)

    def _drop(self, uid: str, key: str) -> None:
        members = self._members.get(key)
        if members is not None:
            old = members.pop(uid, None)
            if old is not None and old.scheduling_gates:
                self._gated[key] -= 1
            if not members:
                del self._members[key]
                self._gated.pop(key, None)
        bound = self._bound.get(key)
        if bound is not None:
            bound.discard(uid)
            if not bound:
                del self._bound[key]
        self._group_of.pop(uid, None)
        assigned = self._assigned.get(key)
        if assigned is not None:
            assigned.discard(uid)
