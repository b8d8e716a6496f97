"""A rival scheduler: a second writer binding its own pods onto nodes shardsched also schedules.

It runs in the chaos runner's process (a thread), creates its pods (``schedulerName:
rival-scheduler``, which shardsched ignores until they are bound, then counts them through the
watch) at a fixed rate, and places each on a random node among its targets where *its own* view
(the nodes' allocatable minus its own pods) has room: a scheduler unaware of shardsched's pods.

- ``ledger`` mode: before binding it takes the pods' leases and reserves them in the Redis ledger
  as the node's owner shard would (same member id, current epoch), binds only what was reserved,
  then commits; the ledger's second check refuses what does not fit (INSUFFICIENT), so it cannot
  overcommit a node shardsched fills at the same time, nor can shardsched overcommit it.
- ``bypass`` mode: it binds straight to the cluster (`AuditedSimCluster.rival_bind_many`); only the
  kubelet-like admission catches an overcommit (its pod, or one of ours racing with it, fails
  ``OutOfcpu``), and the ledger learns its pods only from the watch.

A pod it fails to place 5 times is deleted (it gives up), so every rival pod ends bound or gone.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import ray

from chaos.scenario import RivalArgs
from shardsched.api.quantity import canonical_quantity
from shardsched.errors import ShardschedError
from shardsched.sim import uniform_pods
from shardsched.store.ledger import Ledger, ReservationRef, ReserveItem

log = logging.getLogger(__name__)

RIVAL_SCHEDULER = "rival-scheduler"
TICK_S = 0.1
MAX_ATTEMPTS = 5


class Rival:
    """See module docstring.

    Args:
        cluster: the `AuditedSimCluster` actor.
        ledger: the ledger (for ``ledger`` mode).
        args: what to do.
        targets: node names it may use.
        allocatable: node -> canonical allocatable (cpu, memory, pods).
        name: prefix of its pod names (unique per rival of a run).
    """

    def __init__(self, cluster: Any, ledger: Ledger, args: RivalArgs, targets: list[str],
                 allocatable: dict[str, dict[str, int]], name: str, seed: int, lease_ttl_ms: int) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.args = args
        self.targets = targets
        self.room = {n: dict(allocatable[n]) for n in targets}  # its own view
        self.name = name
        self.rng = random.Random(seed)
        self.ttl_ms = lease_ttl_ms
        self.requests = {"cpu": canonical_quantity("cpu", args.cpu), "memory": canonical_quantity("memory", args.memory),
                         "pods": 1}
        self.stats: Counter = Counter()
        self.reserve_codes: Counter = Counter()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"rival-{name}", daemon=True)
        self._stop = threading.Event()

    def start(self) -> "Rival":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def report(self) -> dict[str, Any]:
        return {"mode": self.args.mode, "targets": len(self.targets), **dict(self.stats),
                "reserve_codes": dict(self.reserve_codes), "errors": self.errors[:5]}

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        pods = uniform_pods(self.args.pods, cpu=self.args.cpu, memory=self.args.memory,
                            scheduler_name=RIVAL_SCHEDULER, prefix=f"{self.name}-")
        pending: dict[str, tuple[dict, int]] = {}  # name -> (stored pod, attempts)
        started = time.monotonic()
        created = 0
        while not self._stop.is_set() and (created < len(pods) or pending):
            due = min(len(pods), int((time.monotonic() - started) * self.args.rate_per_s) + 1)
            try:
                if due > created:
                    for p in ray.get(self.cluster.create_pods.remote(pods[created:due])):
                        pending[p["metadata"]["name"]] = (p, 0)
                    self.stats["created"] += due - created
                    created = due
                if pending:
                    self._place(pending)
            except (ShardschedError, ray.exceptions.RayError) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                log.warning("rival %s: %s", self.name, e)
            self._stop.wait(TICK_S)
        for pod_name in list(pending):  # stopped early: leave nothing pending behind
            self._give_up(pending, pod_name)

    def _choose(self) -> str | None:
        fits = [n for n in self.targets if all(self.room[n].get(r, 0) >= v for r, v in self.requests.items())]
        return self.rng.choice(fits) if fits else None

    def _place(self, pending: dict[str, tuple[dict, int]]) -> None:
        plan: list[tuple[dict, str]] = []
        for pod_name, (pod, attempts) in list(pending.items()):
            node = self._choose()
            if node is None or attempts >= MAX_ATTEMPTS:
                self._give_up(pending, pod_name)
                continue
            pending[pod_name] = (pod, attempts + 1)
            plan.append((pod, node))
        if not plan:
            return
        bound = self._place_ledger(plan) if self.args.mode == "ledger" else self._bind(plan, bypass=True)
        for pod, node in bound:
            pending.pop(pod["metadata"]["name"], None)
            for r, v in self.requests.items():
                self.room[node][r] = self.room[node].get(r, 0) - v

    def _bind(self, plan: list[tuple[dict, str]], bypass: bool) -> list[tuple[dict, str]]:
        """Bind; returns the (pod, node) pairs the API bound (admission-rejected ones included)."""
        bindings = [("default", p["metadata"]["name"], n, p["metadata"]["uid"]) for p, n in plan]
        method = self.cluster.rival_bind_many if bypass else self.cluster.bind_many
        results = ray.get(method.remote(bindings))
        out = []
        for (pod, node), res in zip(plan, results):
            self.stats[f"bind_{res.code}"] += 1
            if res.code == 201:
                out.append((pod, node))
                self.stats["bound"] += 1
                if res.phase == "Failed":
                    self.stats["admission_rejected"] += 1
        return out

    def _place_ledger(self, plan: list[tuple[dict, str]]) -> list[tuple[dict, str]]:
        """Lease, reserve as the node's owner, bind what was reserved, commit; release the rest."""
        owners = self.ledger.owners()
        epoch = self.ledger.epoch()
        by_owner: dict[str, list[tuple[dict, str]]] = defaultdict(list)
        for pod, node in plan:
            by_owner[owners.get(node, "")].append((pod, node))
        bound_all = []
        for owner, items in by_owner.items():
            if not owner:
                self.reserve_codes["NO_OWNER"] += len(items)
                continue
            uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p, _ in items}
            tokens = self.ledger.acquire_leases(list(uid.values()), owner, self.ttl_ms)
            reserve = [ReserveItem(uid[p["metadata"]["name"]], n, tokens[uid[p["metadata"]["name"]]], self.requests)
                       for p, n in items if uid[p["metadata"]["name"]] in tokens]
            results = self.ledger.reserve(owner, epoch, reserve, self.ttl_ms)
            ok = {r.uid for r in results if r.ok}
            for r in results:
                self.reserve_codes[r.code.name] += 1
            bound = self._bind([(p, n) for p, n in items if uid[p["metadata"]["name"]] in ok], bypass=False)
            done = {uid[p["metadata"]["name"]] for p, _ in bound}
            refs = [ReservationRef(it.uid, it.node, it.token) for it in reserve if it.uid in ok]
            self.ledger.commit([r for r in refs if r.uid in done])
            self.ledger.release([r for r in refs if r.uid not in done])
            self.ledger.release_leases({it.uid: it.token for it in reserve}, owner)
            bound_all += bound
        return bound_all

    def _give_up(self, pending: dict[str, tuple[dict, int]], pod_name: str) -> None:
        pending.pop(pod_name, None)
        try:
            ray.get(self.cluster.delete_pod.remote("default", pod_name))
            self.stats["gave_up"] += 1
        except ray.exceptions.RayError as e:
            self.errors.append(f"delete {pod_name}: {e}")
