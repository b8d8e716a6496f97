"""What the coordinator's jobs share: the tracked pods, the shard map and its epoch, the cluster's
NodeTable, under one lock (`CoordinatorState`)."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.api.objects import PodInfo
from shardsched.api.volumes import VolumeCatalog
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.cache.pod_groups import PodGroupCache
from shardsched.config import SchedulerConfiguration
from shardsched.framework.interface import Handle
from shardsched.metrics import ShardMetrics
from shardsched.scheduler.algorithm import GenericScheduler, build_schedulers
from shardsched.sharding.calls import ClusterClient, ShardClient
from shardsched.store.ledger import Ledger

#: `Tracked.shard` of a pod whose shard was removed while the pod was in its last batch (see `Scaler`)
LIMBO = -1


@dataclass
class ShardRef:
    """One shard as the coordinator knows it: its index in the map, its member id
    (``shard-<index>@<incarnation>``, the ledger's owner name) and its client."""

    index: int
    member: str
    client: ShardClient
    incarnation: int = 1
    failures: int = 0
    alive: bool = True


@dataclass
class Nomination:
    """A preemptor's nomination (`shardsched.sharding.coordinator.preemption`): its node ("" once
    cleared), and every pod deleted for it so far (uid -> key; any node, kept across nominations so
    that no victim is deleted twice for the same preemptor), and the GPU devices it holds on the
    node (() for none)."""

    node: str
    victims: dict[str, str] = field(default_factory=dict)
    devices: tuple[int, ...] = ()


@dataclass
class Tracked:
    """A pending pod the coordinator routed."""

    pod: PodInfo
    shard: int
    tried: set[int] = field(default_factory=set)
    rounds: int = 0
    unschedulable: bool = False
    gave_up: bool = False
    message: str = ""


class CoordinatorState:
    """The state every job of the coordinator reads and writes, with `lock` held.

    Attributes:
        table: the whole cluster's NodeTable (bound pods counted, nominated pods assumed).
        schedulers: profile name -> scheduler over `table` with a shard's partial view (routing).
        cluster_schedulers: the same profiles over the whole cluster (`Nominator`, gangs), whose
            Coscheduling reads `pod_groups`.
        pod_groups: the PodGroups and their members, from the watch (`gangs`).
        shards: `ShardRef` per shard index.
        owners: node name -> owner shard index; ``owner_slots`` the same per table slot (-1: none).
        epoch: the shard map's epoch, as last published in the ledger.
        rv: the watch's resourceVersion, where the next poll starts.
        pending: uid -> `Tracked`, every pending pod routed to a shard.
        bound_on: uid -> node of the bound pods counted in `table`.
        nominated: uid -> node of pending pods assumed in `table` on their nominated node (the
            nominator's, and the preemptors' while they wait for their victims).
        preempting: uid -> `Nomination` of the pods that preempted (their node, and
            the victims deleted for them).
        pdbs: ``namespace/name`` -> PodDisruptionBudget, from the watch (what preemption reads).
        storage: the cluster's storage objects from the watch (`VolumeCatalog`, the table's
            ``volumes``, sent to every shard: `storage_snapshot`); None while the cluster does not serve
            `shardsched.cluster.STORAGE_KINDS` (the volume plugins then hold the pods that need them).
        routed: int64 array, shape (shards,): pods routed per shard and not yet bound.
        gated: uid -> pod key, pods a PreEnqueue plugin keeps out of the queue.
        invalid: pod key -> why it cannot be scheduled (bad spec).
        commits: uid -> epoch of the pods their shard reported committed in the ledger, whose
            bound event the intake has not applied yet (`Intake.committed`); emptied by a new
            epoch (`next_epoch`) and by a relist.
    """

    def __init__(self, config: SchedulerConfiguration, ledger: Ledger, cluster: ClusterClient) -> None:
        self.config = config
        self.ledger = ledger
        self.cluster = cluster
        self.profiles = {p.scheduler_name for p in config.profiles}
        self.pod_groups = PodGroupCache()
        self.storage: VolumeCatalog | None = None
        self.reset_table()
        self.shards: list[ShardRef] = []
        self.owners: dict[str, int] = {}
        self.owner_slots = np.zeros(0, np.int32)
        self.epoch = 0
        self.rv = 0
        self.pending: dict[str, Tracked] = {}
        self.bound_on: dict[str, str] = {}
        self.nominated: dict[str, str] = {}
        self.preempting: dict[str, Nomination] = {}
        self.pdbs: dict[str, PodDisruptionBudget] = {}
        self.routed = np.zeros(0, np.int64)
        self.gated: dict[str, str] = {}
        self.invalid: dict[str, str] = {}
        self.commits: dict[str, int] = {}
        self.metrics = ShardMetrics()
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.last_error = ""
        # the loop thread mutates the state; Ray calls (status, ...) read it from other threads
        self.lock = threading.RLock()

    def reset_table(self) -> None:
        """A new empty NodeTable and the schedulers over it (at start and at each relist)."""
        self.table = NodeTable()
        self.table.volumes = self.storage
        self.schedulers: dict[str, GenericScheduler] = build_schedulers(self.config, self.table, seed=0,
                                                                         partial_view=True)
        self.default = next(iter(self.schedulers.values()))
        self.cluster_schedulers = build_schedulers(self.config, self.table, seed=0,
                                                   handle=Handle(pod_groups=self.pod_groups))

    def storage_snapshot(self) -> tuple[list, list, dict[str, str], bool] | None:
        """The arguments of ``Shard.apply_storage`` that give a shard the whole `storage` (a shard
        started, replaced or listed again: ``replace``); None without storage."""
        if self.storage is None:
            return None
        return self.storage.views(), [], dict(self.storage.invalid_pvs), True

    def scheduler_for(self, pod: PodInfo) -> GenericScheduler:
        """The routing scheduler of the pod's profile (the first profile's for an unknown name)."""
        return self.schedulers.get(pod.scheduler_name, self.default)

    def next_epoch(self) -> int:
        """A new epoch, above both ours and the ledger's (another coordinator may have published
        one); set as `epoch` and returned. Raises `TemporaryError` when Redis does not answer."""
        self.epoch = max(self.epoch, self.ledger.epoch()) + 1
        self.commits.clear()  # made under an older map, perhaps in a ledger that lost them: observed
        return self.epoch

    def refresh_owner_slots(self) -> None:
        """`owner_slots` from `owners` and the table's slots (after any change of either)."""
        arr = np.full(self.table.n, -1, np.int32)
        for name, slot in self.table.index.items():
            arr[slot] = self.owners.get(name, -1)
        self.owner_slots = arr

    def unroute(self, shard: int) -> None:
        """One pod fewer routed to ``shard`` (bound, gone, or routed elsewhere); safe for LIMBO."""
        if 0 <= shard < len(self.routed) and self.routed[shard] > 0:
            self.routed[shard] -= 1

    def bound_usages(self, slot: int) -> list[PodUsage]:
        """The pods bound on a table slot, without the assumed nominated ones."""
        return [u for u in self.table.pods[slot].values() if u.uid not in self.nominated]
