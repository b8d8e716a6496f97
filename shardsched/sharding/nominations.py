"""The nominated pods of a shard's nodes (upstream's ``PodNominator``), counted in the shard's table.

A preemptor waits among the unschedulable pods of the shard that owns its nominated node (the
coordinator sends it there with ``nominated_node_name`` set). While it waits, the room its victims
leave must not go to another pod of equal or lower priority: upstream's
``RunFilterPluginsWithNominatedPods`` adds the nominated pods of equal or higher priority to the
node before the Filters run. Here they are counted on their nodes in the shard's `NodeTable`, as
assumed pods are, and taken out for a pod of higher priority (`NominatedPods.for_pod`), so the
shard's own Filters see the nominations instead of placing a pod there that the ledger's Reserve
would refuse (the ledger keeps the nomination either way).

Resource fit only gets harder with more pods on a node, so counting the nominated pods is the
upstream check with them added; the check without them (for Filters that pods can only help,
such as required pod affinity) is the coordinator's, over the whole cluster.

Call every method with the shard's lock held.
"""

from __future__ import annotations

from shardsched.api.objects import PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage


class NominatedPods:
    """Nominated pods of ``table``'s nodes, each counted there (module docstring).

    Attributes:
        pods: uid -> (pod key, its usage, its nominated node), counted in the table unless hidden.
    """

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self.pods: dict[str, tuple[str, PodUsage, str]] = {}
        self._uid_of: dict[str, str] = {}  # key -> uid
        self._hidden: set[str] = set()  # uids taken out of the table for the pod being scheduled
        self._lowest: int | None = None  # the lowest priority among `pods`

    def __contains__(self, uid: str) -> bool:
        return uid in self.pods

    def __len__(self) -> int:
        return len(self.pods)

    def add(self, pod: PodInfo) -> None:
        """Count ``pod`` on its ``nominated_node_name`` (replacing a nomination it had); a pod
        without one, or nominated to a node this table does not have, loses any it had. A pod the
        table counts already (bound or assumed) is left alone."""
        self.remove(pod.uid)
        node = pod.nominated_node_name
        if not node or node not in self.table.index or self.table.node_of(pod.uid) is not None:
            return
        usage = PodUsage.of(pod)
        self.table.add_pod(usage, node)
        self.pods[pod.uid] = (pod.key, usage, node)
        self._uid_of[pod.key] = pod.uid
        self._lowest = usage.priority if self._lowest is None else min(self._lowest, usage.priority)

    def remove(self, uid: str) -> None:
        """The pod is no longer nominated here (it is being scheduled, was handed back, moved to
        another shard or deleted): its usage leaves the table. Safe for any uid."""
        if self.forget(uid):
            self.table.remove_pod(uid)

    def remove_key(self, key: str) -> None:
        """`remove` by ``namespace/name``."""
        uid = self._uid_of.get(key)
        if uid is not None:
            self.remove(uid)

    def forget(self, uid: str) -> bool:
        """The pod is now counted in the table as bound (the watch): drop the nomination and leave
        the table as it is. Returns whether it was nominated here."""
        entry = self.pods.pop(uid, None)
        if entry is None:
            return False
        self._uid_of.pop(entry[0], None)
        if uid in self._hidden:
            self._hidden.discard(uid)
            self.table.add_pod(entry[1], entry[2])  # callers that remove it expect it counted
        if not self.pods:
            self._lowest = None
        elif entry[1].priority == self._lowest:
            self._lowest = min(u.priority for _, u, _ in self.pods.values())
        return True

    def for_pod(self, pod: PodInfo) -> None:
        """Before ``pod`` is scheduled: the table counts the nominations of priority at least the
        pod's (its own excepted: call `remove` for it first) and not those of lower priority,
        which upstream leaves out for it; hidden ones come back for the next pod that counts them."""
        if not self.pods:
            return
        if self._lowest is not None and pod.priority <= self._lowest:
            if self._hidden:
                self.restore()
            return
        for uid, (_, usage, node) in self.pods.items():
            lower = usage.priority < pod.priority
            if lower and uid not in self._hidden:
                self.table.remove_pod(uid)
                self._hidden.add(uid)
            elif not lower and uid in self._hidden:
                self.table.add_pod(usage, node)
                self._hidden.discard(uid)

    def restore(self) -> None:
        """Count every hidden nomination again (after a batch's scheduling cycle)."""
        for uid in self._hidden:
            _, usage, node = self.pods[uid]
            self.table.add_pod(usage, node)
        self._hidden.clear()

    def clear(self) -> None:
        """Drop every nomination, leaving the table as it is (the table is being emptied)."""
        self.pods.clear()
        self._uid_of.clear()
        self._hidden.clear()
        self._lowest = None
