"""Builders for the default scenario of the field report: many identical nodes (8 cores, 16 GiB,
110 pods each, the kubelet's default ``maxPods``) and a burst of identical pods (1 core, 1 GiB)
handled by our scheduler (``spec.schedulerName``).

Objects are plain dicts in the shape `SimCluster` and a real API server accept.
"""

from __future__ import annotations

from typing import Mapping

#: ``spec.schedulerName`` of the pods shardsched schedules in the built-in scenarios.
SCHEDULER_NAME = "shardsched"
#: Image of generated pods (the one kube's scheduler_perf templates use).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def _names(prefix: str, n: int) -> list[str]:
    """``prefix`` + zero-padded index, at least 5 digits: ``node-00000``, ``node-00001``, ..."""
    width = max(5, len(str(max(n - 1, 0))))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


def uniform_nodes(n: int, cpu: str = "8", memory: str = "16Gi", pods: int = 110,
                  labels: Mapping[str, str] | None = None, prefix: str = "node-") -> list[dict]:
    """``n`` identical Ready nodes named ``<prefix>00000``...

    Args:
        cpu, memory: allocatable quantities (capacity is the same).
        pods: allocatable pod count.
        labels: extra labels on every node, besides ``kubernetes.io/hostname`` (set as the kubelet does).

    Returns:
        Node dicts, shape ``{apiVersion, kind, metadata: {name, labels}, spec: {}, status:
        {capacity, allocatable, conditions: [Ready]}}``.
    """
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {**(labels or {}), "kubernetes.io/hostname": name}},
            "spec": {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for name in _names(prefix, n)
    ]


def uniform_pods(n: int, cpu: str = "1", memory: str = "1Gi", scheduler_name: str = SCHEDULER_NAME,
                 prefix: str = "pod-", namespace: str = "default") -> list[dict]:
    """``n`` identical pending pods named ``<prefix>00000``..., one container requesting ``cpu``
    and ``memory``.

    Returns:
        Pod dicts, shape ``{apiVersion, kind, metadata: {name, namespace}, spec: {schedulerName,
        containers: [{name, image, resources: {requests}}]}}``.
    """
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "schedulerName": scheduler_name,
                "containers": [
                    {"name": "main", "image": PAUSE_IMAGE, "resources": {"requests": {"cpu": cpu, "memory": memory}}}
                ],
            },
        }
        for name in _names(prefix, n)
    ]
