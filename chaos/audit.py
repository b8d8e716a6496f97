"""The simulated cluster with an auditor at the API: every bind is checked against the ledger's
fencing when it is applied, and every applied bind and admission rejection is logged.

`AuditedSimCluster` is `SimClusterHost` (the embedded API server) plus, per bind request:

- **fencing check** (before the bind is applied; one pipelined read of the ledger, not through the
  fault proxy): the pod's lease must be live (Redis server time), and the lease holder must hold a
  reservation of the pod on the target node made with the lease's token. Otherwise the bind is
  *stale*: ``lease_missing``, ``lease_expired`` or ``no_reservation`` (the binder's token is not
  the pod's current one). A lease holder that does not own the node in the current shard map is
  recorded as ``stale_epoch`` (its reservation was made under an older map: safe, since lease and
  reservation still hold, and reported). When the ledger cannot be read (Redis away) or has lost
  its data (no epoch), the bind is ``unverified``.
- **who bound**: shards (and a rival that goes through the ledger) call `bind_many`; a rival that
  bypasses the ledger calls `rival_bind_many`, logged as ``bypass``.
- **bind log**: time, pod, node, binder, fencing verdict, phase and admission reason of every bind
  the API applied (a 504 whose bind was applied included), from which the runner derives
  throughput, per-pod bind times, overcommit attempts and stale binds.

Plus the chaos controls that must run inside the cluster: changing the bind faults, and deleting
pods or nodes in bulk. The runner calls it through `ChaosClusterClient`.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

from shardsched.errors import ShardschedError
from shardsched.sharding.calls import Reply, SimClusterClient
from shardsched.sharding.sim_actor import SimClusterHost
from shardsched.sim import SCHEDULER_NAME, FaultConfig
from shardsched.store.ledger import Ledger
from shardsched.store.server import connect

#: fencing verdicts that make a bind stale (docs/design.md invariant 2)
STALE = ("lease_missing", "lease_expired", "no_reservation")
#: where binds come from
SCHEDULER, BYPASS = "scheduler", "bypass"


class AuditedSimCluster(SimClusterHost):
    """See module docstring.

    Args:
        redis_url: the ledger's Redis (direct, never through the fault proxy).
        prefix: the ledger's key prefix.
        seed, faults: as `SimCluster`.
    """

    def __init__(self, redis_url: str, prefix: str, seed: int = 0, faults: FaultConfig | None = None) -> None:
        super().__init__(seed=seed, faults=faults)
        self._ledger = Ledger(connect(redis_url, timeout_s=1.0, connect_timeout_s=0.5, retries=0), prefix)
        self._tls = threading.local()
        self._log: list[tuple] = []  # (unix s, key, node, binder, fence, phase, reason, scheduler)
        self._verdicts: Counter = Counter()
        self._chaos_rng = random.Random(seed + 1)

    # ------------------------------------------------------------------ binds
    def bind_many(self, bindings):
        bindings = [tuple(b) for b in bindings]
        self._tls.binder = SCHEDULER
        self._tls.fences = self._fences(bindings)
        try:
            return super().bind_many(bindings)
        finally:
            self._tls.fences = {}

    def rival_bind_many(self, bindings):
        """Binds of a scheduler that bypasses the ledger (logged as ``bypass``, not fence-checked)."""
        self._tls.binder = BYPASS
        self._tls.fences = {}
        return super().bind_many([tuple(b) for b in bindings])

    def _apply_bind(self, key: str, pod: dict, node_name: str, annotations=None) -> dict:
        status = super()._apply_bind(key, pod, node_name, annotations)
        binder = getattr(self._tls, "binder", SCHEDULER)
        fence = (getattr(self._tls, "fences", None) or {}).get(key, "") if binder == SCHEDULER else ""
        self._verdicts[fence or binder] += 1
        self._log.append((time.time(), key, node_name, binder, fence, status["phase"], status.get("reason", ""),
                          pod["spec"].get("schedulerName")))
        return status

    def _fences(self, bindings: list[tuple]) -> dict[str, str]:
        """Pod key -> fencing verdict (module docstring), read before the binds are applied."""
        keys = [f"{b[0]}/{b[1]}" for b in bindings]
        try:
            now_ms, epoch, views = self._ledger.fence_views([(b[3] if len(b) > 3 else "", b[2]) for b in bindings])
        except ShardschedError:
            return {key: "unverified" for key in keys}
        if not epoch:
            return {key: "unverified" for key in keys}  # the ledger lost its data
        out = {}
        for key, v in zip(keys, views):
            if v.holder is None:
                out[key] = "lease_missing"
            elif v.expiry_ms <= now_ms:
                out[key] = "lease_expired"
            elif v.reserved_by != (v.holder, v.token):
                out[key] = "no_reservation"
            elif v.owner != v.holder:
                out[key] = "stale_epoch"
            else:
                out[key] = "ok"
        return out

    # ------------------------------------------------------------------ reports
    def audit(self) -> dict[str, Any]:
        """The bind log and the fencing verdicts (plain data for the runner)."""
        with self._lock:
            return {"log": list(self._log), "verdicts": dict(self._verdicts)}

    def chaos_progress(self) -> dict[str, int]:
        """Our pods (schedulerName shardsched): total, bound, unbound; and other pods unbound."""
        with self._lock:
            ours = bound = others_unbound = 0
            for p in self._pods.values():
                mine = p["spec"].get("schedulerName") == SCHEDULER_NAME
                has_node = bool(p["spec"].get("nodeName"))
                ours += mine
                bound += mine and has_node
                others_unbound += (not mine) and not has_node
        return {"pods": ours, "bound": bound, "unbound": ours - bound, "others_unbound": others_unbound}

    def unbound_keys(self) -> list[str]:
        """Keys of our pods without a node."""
        with self._lock:
            return sorted(k for k, p in self._pods.items()
                          if p["spec"].get("schedulerName") == SCHEDULER_NAME and not p["spec"].get("nodeName"))

    def preemptions(self) -> dict[str, Any]:
        """What the scheduler's preemptions left in the API: ``victims``, one entry per victim and
        preemptor as their ``Preempted`` Events say (``Preempted by pod <uid> on node <node>``):
        ``[victim key, victim uid, preemptor uid, node, count]`` (count > 1: the same victim
        deleted again for the same preemptor); ``uids``: pod uid -> key of the pods that exist."""
        with self._lock:
            victims = []
            for (ns, name), events in self._events.items():
                for ev in events:
                    words = ev["message"].split()
                    if ev["reason"] != "Preempted" or words[:3] != ["Preempted", "by", "pod"] or len(words) < 7:
                        continue
                    victims.append([f"{ns or 'default'}/{name}", ev["involvedObject"].get("uid", ""), words[3],
                                    words[6], ev["count"]])
            return {"victims": victims, "uids": {p["metadata"]["uid"]: k for k, p in self._pods.items()}}

    def requested_all(self) -> dict[str, dict[str, int]]:
        """Node -> the requests of its non-terminal bound pods (what the ledger's usage must equal)."""
        with self._lock:
            return {n: dict(self._requested.get(n, {})) for n in self._nodes}

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._nodes)

    def bound_per_label(self, key: str) -> dict[str, int]:
        """Value of node label ``key`` -> our non-terminal pods bound on nodes with it (every value
        of the nodes present, 0 included)."""
        with self._lock:
            out = {n["metadata"]["labels"][key]: 0 for n in self._nodes.values() if key in n["metadata"].get("labels", {})}
            for p in self._pods.values():
                node = self._nodes.get(p["spec"].get("nodeName") or "")
                if (node is not None and p["spec"].get("schedulerName") == SCHEDULER_NAME
                        and key in node["metadata"].get("labels", {})
                        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")):
                    out[node["metadata"]["labels"][key]] += 1
            return out

    # ------------------------------------------------------------------ chaos controls
    def bound_per_pod_label(self, key: str) -> dict[str, int]:
        """Value of pod label ``key`` -> our non-terminal pods with it that are bound (every value
        of our pods, 0 included): per gang, its bound members."""
        with self._lock:
            out: dict[str, int] = {}
            for p in self._pods.values():
                value = (p["metadata"].get("labels") or {}).get(key)
                if value is None or p["spec"].get("schedulerName") != SCHEDULER_NAME:
                    continue
                bound = bool(p["spec"].get("nodeName")) and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                out[value] = out.get(value, 0) + bound
            return out

    def set_faults(self, faults: FaultConfig) -> None:
        with self._lock:
            self._faults = faults

    def faults(self) -> FaultConfig:
        return self._faults

    def delete_random_pods(self, count: int, state: str, scheduler_name: str = SCHEDULER_NAME) -> list[str]:
        """Delete ``count`` pods of ``scheduler_name`` chosen at random among the ``state`` ones
        (pending, bound, any). Returns their keys."""
        with self._lock:
            keys = sorted(k for k, p in self._pods.items() if p["spec"].get("schedulerName") == scheduler_name
                          and (state == "any" or (state == "bound") == bool(p["spec"].get("nodeName"))))
            chosen = self._chaos_rng.sample(keys, min(count, len(keys)))
            for key in chosen:
                self._delete_pod(key)
            return chosen

    def delete_random_nodes(self, count: int) -> list[str]:
        """Delete ``count`` nodes at random, with their pods. Returns their names."""
        with self._lock:
            names = self._chaos_rng.sample(sorted(self._nodes), min(count, len(self._nodes)))
        for name in names:
            self.delete_node(name, delete_pods=True)
        return names


class ChaosClusterClient(SimClusterClient):
    """`SimClusterClient` of an `AuditedSimCluster` actor, with its audit and chaos calls (each
    named by the class's own method, as `shardsched.sharding.calls` names a call)."""

    def create_replica_set(self, obj: Any) -> Reply[dict]:
        return self.channel.send(AuditedSimCluster.create_replica_set, obj)

    def audit(self) -> Reply[dict[str, Any]]:
        return self.channel.send(AuditedSimCluster.audit)

    def chaos_progress(self) -> Reply[dict[str, int]]:
        return self.channel.send(AuditedSimCluster.chaos_progress)

    def unbound_keys(self) -> Reply[list[str]]:
        return self.channel.send(AuditedSimCluster.unbound_keys)

    def preemptions(self) -> Reply[dict[str, Any]]:
        return self.channel.send(AuditedSimCluster.preemptions)

    def requested_all(self) -> Reply[dict[str, dict[str, int]]]:
        return self.channel.send(AuditedSimCluster.requested_all)

    def node_names(self) -> Reply[list[str]]:
        return self.channel.send(AuditedSimCluster.node_names)

    def bound_per_label(self, key: str) -> Reply[dict[str, int]]:
        return self.channel.send(AuditedSimCluster.bound_per_label, key)

    def bound_per_pod_label(self, key: str) -> Reply[dict[str, int]]:
        return self.channel.send(AuditedSimCluster.bound_per_pod_label, key)

    def set_faults(self, faults: FaultConfig) -> Reply[None]:
        return self.channel.send(AuditedSimCluster.set_faults, faults)

    def faults(self) -> Reply[FaultConfig]:
        return self.channel.send(AuditedSimCluster.faults)

    def delete_random_pods(self, count: int, state: str) -> Reply[list[str]]:
        return self.channel.send(AuditedSimCluster.delete_random_pods, count, state)

    def delete_random_nodes(self, count: int) -> Reply[list[str]]:
        return self.channel.send(AuditedSimCluster.delete_random_nodes, count)
