"""The embedded simulated cluster (API server semantics, kubelet-like admission, faults), workload
builders, and the Alibaba GPU trace loader and replay."""

from shardsched.sim.cluster import (
    ADDED,
    DELETED,
    MODIFIED,
    BindResult,
    Binding,
    FaultConfig,
    SimCluster,
    WatchEvent,
)
from shardsched.sim.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    Timeout,
    TraceError,
)
from shardsched.sim.trace import LoadReport, ReplayStep, TracePod, TraceReplay, load_nodes, load_pods
from shardsched.sim.workload import SCHEDULER_NAME, uniform_nodes, uniform_pods

__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "AlreadyExists",
    "ApiError",
    "BindResult",
    "Binding",
    "Conflict",
    "FaultConfig",
    "Gone",
    "Invalid",
    "LoadReport",
    "NotFound",
    "ReplayStep",
    "SCHEDULER_NAME",
    "ServerError",
    "SimCluster",
    "Timeout",
    "TraceError",
    "TracePod",
    "TraceReplay",
    "WatchEvent",
    "load_nodes",
    "load_pods",
    "uniform_nodes",
    "uniform_pods",
]
