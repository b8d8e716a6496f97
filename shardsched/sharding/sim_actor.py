"""The simulated cluster as a Ray actor: the embedded run's "API server" (`sim_cluster_actor`)."""

from __future__ import annotations

import os
from typing import Any

import ray

from shardsched import gctune
from shardsched.cluster.errors import NotFound
from shardsched.sharding.actors import MAX_CONCURRENCY
from shardsched.sim.cluster import SimCluster


def unschedulable(pod: dict) -> bool:
    """The pod has the condition PodScheduled=False with reason Unschedulable (what ``kubectl get
    pods`` shows as such)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or ())


class SimClusterHost(SimCluster):
    """The simulated cluster as an actor (adds the process id, for the CPU/memory report)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        gctune.tune()  # this actor's process (shardsched.gctune)
        super().__init__(*args, **kwargs)
        #: pods deleted so far, by whether they were bound then
        self._deleted = {"bound": 0, "unbound": 0}

    def pid(self) -> int:
        return os.getpid()

    def set_pod_condition(self, namespace: str, name: str, condition: dict, resource_version: str | None = None) -> bool:
        """`SimCluster.set_pod_condition`, where a pod deleted meanwhile (404) is an expected outcome:
        the coordinator's writes are fire and forget (a trace replay deletes pods at any moment), so
        it answers False, as for a pod left unchanged, instead of an error nobody reads."""
        try:
            return super().set_pod_condition(namespace, name, condition, resource_version)
        except NotFound:
            return False

    def _delete_pod(self, key: str) -> dict:
        pod = super()._delete_pod(key)
        self._deleted["bound" if pod["spec"].get("nodeName") else "unbound"] += 1
        return pod

    def progress(self) -> dict[str, Any]:
        """The cluster's state in one read, for the run's progress and its plot.

        Returns:
            pods: pods that exist; bound, unbound: of them, with and without ``spec.nodeName``;
            unschedulable: unbound pods that are `unschedulable`; binds: successful binds so
            far, less double binds (pods ever bound, the deleted ones included); deleted_bound,
            deleted_unbound: pods deleted so far after and before they were bound; requested:
            resource name -> total request of the non-terminal bound pods, canonical units.
        """
        with self._lock:
            unbound = [p for p in self._pods.values() if not p["spec"].get("nodeName")]
            n_unschedulable = sum(1 for p in unbound if unschedulable(p))
            requested: dict[str, int] = {}
            for per_node in self._requested.values():
                for resource, v in per_node.items():
                    requested[resource] = requested.get(resource, 0) + v
            return {"pods": len(self._pods), "bound": len(self._pods) - len(unbound), "unbound": len(unbound),
                    "unschedulable": n_unschedulable, "binds": self._stats["binds"] - self._stats["double_binds"],
                    "deleted_bound": self._deleted["bound"], "deleted_unbound": self._deleted["unbound"],
                    "requested": requested}


def sim_cluster_actor(**kwargs: Any) -> Any:
    """Start the simulated cluster as a Ray actor (the embedded "API server")."""
    kwargs.setdefault("copy_inputs", False)  # Ray hands the actor private copies of its arguments
    return ray.remote(SimClusterHost).options(max_concurrency=MAX_CONCURRENCY, num_cpus=0).remote(**kwargs)
