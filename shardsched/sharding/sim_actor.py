"""The simulated cluster as a Ray actor: the embedded run's "API server" (`sim_cluster_actor`)."""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

import ray

from shardsched import gctune
from shardsched.cluster import DELETED, POD
from shardsched.cluster.errors import NotFound
from shardsched.sharding.actors import ACTOR_RUNTIME_ENV, MAX_CONCURRENCY
from shardsched.sharding.binding_cycle import CREATED_AT_ANNOTATION
from shardsched.sim.cluster import SimCluster


def unschedulable(pod: dict) -> bool:
    """The pod has the condition PodScheduled=False with reason Unschedulable (what ``kubectl get
    pods`` shows as such)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or ())


class SimClusterHost(SimCluster):
    """The simulated cluster as an actor, with what the embedded run reads of it: the process id
    (for the CPU/memory report), `progress` (counts kept as pods are written, so a read costs
    nothing per pod) and `bind_times` (the run's creation -> bound latencies, timed where the
    binding is written, so the shards keep no statistics for the benchmark)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        gctune.tune()  # this actor's process (shardsched.gctune)
        #: pods that exist without spec.nodeName, and of them those `unschedulable` (kept by `_commit`)
        self._unbound = 0
        self._unschedulable = 0
        #: creation -> bound seconds of the pods bound carrying CREATED_AT_ANNOTATION; Unix time of
        #: every bind applied
        self._latencies_s: list[float] = []
        self._bound_at: list[float] = []
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

    def _commit(self, type_: str, kind: str, obj: dict) -> dict:
        if kind == POD:  # every pod write comes here once: a deleted pod is already out of `_pods`
            if type_ == DELETED:
                self._count(obj, -1)
            else:
                meta = obj["metadata"]
                old = self._pods.get(f"{meta['namespace']}/{meta['name']}")
                if old is not None:
                    self._count(old, -1)
                self._count(obj, 1)
        return super()._commit(type_, kind, obj)

    def _count(self, pod: dict, sign: int) -> None:
        if not pod["spec"].get("nodeName"):
            self._unbound += sign
            if unschedulable(pod):
                self._unschedulable += sign

    def _apply_bind(self, key: str, pod: dict, node_name: str, annotations: Mapping[str, str] | None = None) -> dict:
        status = super()._apply_bind(key, pod, node_name, annotations)
        now = time.time()
        self._bound_at.append(now)
        created = (pod["metadata"].get("annotations") or {}).get(CREATED_AT_ANNOTATION)
        if created:
            self._latencies_s.append(now - float(created))
        return status

    def bind_times(self) -> dict[str, list]:
        """What the run's report measures of the binds so far: ``latencies_s``, creation (the
        pod's CREATED_AT_ANNOTATION) -> binding written, seconds, one per pod bound that carries
        the annotation, in bind order; ``timeline``, (Unix time, 1) per bind applied (a bind whose
        answer timed out but was applied counts: the pod is bound)."""
        with self._lock:
            return {"latencies_s": list(self._latencies_s), "timeline": [(t, 1) for t in self._bound_at]}

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
            requested: dict[str, int] = {}
            for per_node in self._requested.values():
                for resource, v in per_node.items():
                    requested[resource] = requested.get(resource, 0) + v
            return {"pods": len(self._pods), "bound": len(self._pods) - self._unbound, "unbound": self._unbound,
                    "unschedulable": self._unschedulable, "binds": self._stats["binds"] - self._stats["double_binds"],
                    "deleted_bound": self._deleted["bound"], "deleted_unbound": self._deleted["unbound"],
                    "requested": requested}


def sim_cluster_actor(**kwargs: Any) -> Any:
    """Start the simulated cluster as a Ray actor (the embedded "API server")."""
    kwargs.setdefault("copy_inputs", False)  # Ray hands the actor private copies of its arguments
    return ray.remote(SimClusterHost).options(max_concurrency=MAX_CONCURRENCY, num_cpus=0,
                                              runtime_env=ACTOR_RUNTIME_ENV).remote(**kwargs)
