"""Typed views of Kubernetes Pods and Nodes in canonical integer units."""

from shardsched.api.quantity import (
    CPU,
    EPHEMERAL_STORAGE,
    MEMORY,
    PODS,
    canonical_quantity,
    parse_resource_list,
)
from shardsched.api.requests import nonzero_requests, pod_requests
from shardsched.api.objects import NodeInfo, PodInfo, Taint, Toleration, ContainerPort

__all__ = [
    "CPU",
    "EPHEMERAL_STORAGE",
    "MEMORY",
    "PODS",
    "ContainerPort",
    "NodeInfo",
    "PodInfo",
    "Taint",
    "Toleration",
    "canonical_quantity",
    "nonzero_requests",
    "parse_resource_list",
    "pod_requests",
]
