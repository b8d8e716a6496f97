"""The cluster contract both backends implement (`ClusterBackend`): list and watch (`WatchEvent`),
bind (`Binding`, `BindResult`), pod deletion and status, Events, the typed `ApiError` family, and
the `Capabilities` a backend declares. The simulated cluster (`shardsched.sim`) and the Kubernetes
backend (`shardsched.kube`) import it and never each other."""

from shardsched.cluster.backend import Capabilities, ClusterBackend, PerProcessBackend, WriteGate
from shardsched.cluster.binding import BOUND, CONFLICT, MAYBE_APPLIED, NOT_APPLIED, NOT_FOUND, Binding, BindResult
from shardsched.cluster.disruption import apply_pdb_events
from shardsched.cluster.preemption import Candidate, CandidateResult, Victim, prepare_candidate, prepare_candidates
from shardsched.cluster.podgroups import apply_pod_group_events
from shardsched.cluster.spread import spread_selector_changes
from shardsched.cluster.storage import StorageChanges, storage_changes
from shardsched.cluster.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    Timeout,
)
from shardsched.cluster.watch import (ADDED, CSI_NODE, CSI_STORAGE_CAPACITY, DELETED, MODIFIED, NAMESPACE, NODE, PDB, POD,
                                      PODGROUP, PV, PVC, SPREAD_SELECTOR_KINDS, STORAGE_CLASS, STORAGE_KINDS, WatchEvent,
                                      MAX_WATCH_WAIT_S, read_event_log, wait_for_events)

__all__ = [
    "ADDED",
    "MAX_WATCH_WAIT_S",
    "BOUND",
    "CONFLICT",
    "DELETED",
    "MAYBE_APPLIED",
    "MODIFIED",
    "NAMESPACE",
    "NODE",
    "NOT_APPLIED",
    "NOT_FOUND",
    "PDB",
    "POD",
    "PODGROUP",
    "SPREAD_SELECTOR_KINDS",
    "PV",
    "PVC",
    "STORAGE_CLASS",
    "STORAGE_KINDS",
    "CSI_NODE",
    "CSI_STORAGE_CAPACITY",
    "AlreadyExists",
    "ApiError",
    "BindResult",
    "Binding",
    "Candidate",
    "CandidateResult",
    "Capabilities",
    "ClusterBackend",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "NotFound",
    "PerProcessBackend",
    "ServerError",
    "StorageChanges",
    "Timeout",
    "Victim",
    "WatchEvent",
    "WriteGate",
    "apply_pdb_events",
    "apply_pod_group_events",
    "prepare_candidate",
    "prepare_candidates",
    "read_event_log",
    "wait_for_events",
    "spread_selector_changes",
    "storage_changes",
]
