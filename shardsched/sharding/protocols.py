"""The small protocols a shard talks through, so the same Shard runs in tests (plain objects), in a
Ray actor (handles wrapped by `shardsched.sharding.actors`), and against a real API server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from shardsched.cluster import WriteGate
from shardsched.queue import QueuedPodInfo


class BindTarget(Protocol):
    """The cluster as a shard sees it: batched binds (the API server's ``pods/binding``),
    VolumeBinding's PreBind writes, and the backend's ``gate`` (`shardsched.cluster.WriteGate`, or None) its binds are marked in."""

    gate: WriteGate | None

    def bind_many(self, bindings: Sequence[tuple[str, str, str, str]]) -> list[Any]:
        """(namespace, name, node, uid) per pod -> one result per pod with ``.code`` (201 bound, 404,
        409, 500, 504) and ``.message``; never raises for one item."""
        ...

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        """VolumeBinding's PreBind write of a PV's ``claimRef`` (`shardsched.cluster.ClusterBackend`)."""
        ...

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        """VolumeBinding's PreBind write of a claim's ``volume.kubernetes.io/selected-node``."""
        ...

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """Whether the cluster shows the claim bound (False where this copy does not know)."""
        ...


#: reasons a shard hands a pod to the rebalancer
UNSCHEDULABLE_HERE = "unschedulable"  # no node of this shard fits
FENCED = "fenced"  # the shard no longer owns the chosen node (stale shard map)
INSUFFICIENT = "insufficient"  # the second resource check in Redis failed
BIND_FAILED = "bind_failed"  # the API answered 5xx or timed out
BIND_CONFLICT = "bind_conflict"  # the API answered 409 or 404: bound or deleted, or not; the watch knows


@dataclass
class Handoff:
    """A pod handed to the rebalancer, with why and the shard's kube-style message.

    Attributes:
        reasons: for UNSCHEDULABLE_HERE, reason -> number of this shard's nodes (to build the
            cluster-wide ``0/N nodes are available`` message); empty otherwise.
        nodes: number of nodes the shard had when it decided.
    """

    qpi: QueuedPodInfo
    reason: str
    message: str
    reasons: dict[str, int] = field(default_factory=dict)
    nodes: int = 0


class Rebalancer(Protocol):
    def handoff(self, shard: int, items: list[Handoff]) -> None:
        """Take pods a shard cannot place now (fire and forget)."""
        ...

    def committed(self, shard: int, epoch: int, uids: list[str]) -> None:
        """Pods this shard bound and committed in the ledger, under the shard map's ``epoch`` as
        the shard knew it before the commit (fire and forget): when the watch shows them bound
        the coordinator need not observe them into the ledger again, unless the epoch changed
        meanwhile (`shardsched.sharding.coordinator.intake.Intake.committed`)."""
        ...
