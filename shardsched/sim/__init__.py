"""The embedded simulated cluster (API server semantics, kubelet-like admission, faults), workload
builders, and the Alibaba GPU trace loader and replay. Its types and errors are the cluster
contract's (`shardsched.cluster`)."""

from shardsched.sim.cluster import FaultConfig, SimCluster
from shardsched.sim.trace import LoadReport, ReplayStep, TraceError, TracePod, TraceReplay, load_nodes, load_pods
from shardsched.sim.workload import SCHEDULER_NAME, uniform_nodes, uniform_pods

__all__ = [
    "FaultConfig",
    "LoadReport",
    "ReplayStep",
    "SCHEDULER_NAME",
    "SimCluster",
    "TraceError",
    "TracePod",
    "TraceReplay",
    "load_nodes",
    "load_pods",
    "uniform_nodes",
    "uniform_pods",
]
