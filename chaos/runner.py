"""The chaos runner: one scenario on the embedded runtime (`EmbeddedRun`), its faults, its verdict.

`ChaosRun` is `EmbeddedRun` (local Ray, the simulated cluster, a coordinator and shards) with:

- its own Redis when the scenario restarts it or wants AOF (`EmbeddedRedis`), else the given URL;
- the fault proxy between the shards and Redis when the scenario asks for it (the coordinator and
  the auditor reach Redis directly);
- the cluster replaced by `chaos.audit.AuditedSimCluster`, which checks every bind's fencing token
  when the API applies it and logs every bind and admission rejection;
- a fault thread that executes the scenario's schedule (times from the start of the workload) and
  undoes timed faults when they end;
- a follow loop that samples progress, restarts a dead coordinator (`EmbeddedRun.coordinator_status`,
  the run's supervisor), polls every shard's counters (so a killed shard's last numbers are kept),
  and ends when the faults are over and every pod of ours is bound or known unschedulable, or at
  the scenario's deadline;
- at the end, the ledger compared with the cluster's truth, then `chaos.verdict.build_verdict`.
"""

from __future__ import annotations

import heapq
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from chaos.audit import AuditedSimCluster, ChaosClusterClient
from chaos.proxy import FaultProxy, measure_ping_s
from chaos.rival import Rival
from chaos.scenario import REPLICA_SET_APP, Scenario
from chaos.verdict import Verdict, build_verdict
from shardsched.api.quantity import canonical_quantity
from shardsched.api.podgroup import POD_GROUP_LABEL
from shardsched.cache.devices import is_device_resource
from shardsched.config import load_config
from shardsched.errors import ShardschedError
from shardsched.sharding.actors import MAX_CONCURRENCY
from shardsched.sharding.binding_cycle import CREATED_AT_ANNOTATION
from shardsched.sharding.calls import ShardHostClient
from shardsched.sharding.remote import channel
from shardsched.sharding.embedded import EmbeddedRun
from shardsched.sharding.run_control import RunOptions
from shardsched.sharding.run_report import RunReport
from shardsched.sharding.shard import ShardOptions
from shardsched.sim import SCHEDULER_NAME, uniform_nodes, uniform_pods

ZONE_LABEL = "topology.kubernetes.io/zone"
#: the label of the workload's pods when they spread over the zones
SPREAD_APP = "chaos-spread"
from shardsched.store.ledger import Ledger
from shardsched.store.server import EmbeddedRedis, connect

log = logging.getLogger(__name__)

CONFIG = f"""\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: {SCHEDULER_NAME}
"""
#: the profile of a workload of gangs: Coscheduling sorts the queue and holds each gang together
GANG_CONFIG = CONFIG + """\
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}]
      disabled: [{name: PrioritySort}]
"""
SAMPLE_S = 0.25
SHARD_POLL_S = 1.0
#: after the last fault ends, the run goes on at least this long before it may settle
QUIET_S = 1.0


@dataclass
class FaultRecord:
    """One executed fault; times in Unix seconds (``end`` = ``start`` for an instantaneous one)."""

    action: str
    start: float
    end: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass
class KillRecord:
    """A shard killed at ``at`` (Unix s) while it held ``keys`` (queued or in flight)."""

    index: int
    member: str
    at: float
    keys: list[str]


class ChaosRun(EmbeddedRun):
    """Run one scenario (see module docstring).

    Args:
        scenario: the validated scenario (its short version already merged in when wanted).
        redis_url: an existing Redis for scenarios that neither restart it nor need AOF (tests pass
            the session's); None starts a private one.
        short: recorded in the verdict.
        on_progress: as `EmbeddedRun` (bound, total, coordinator status), about 4 times a second.
    """

    def __init__(self, scenario: Scenario, redis_url: str | None = None, short: bool = False,
                 on_progress: Callable[[int, int, dict], None] | None = None) -> None:
        s = scenario
        self.scenario = s
        self.short = short
        nodes = uniform_nodes(s.cluster.nodes, cpu=s.cluster.cpu, memory=s.cluster.memory, pods=s.cluster.max_pods)
        for i, node in enumerate(nodes if s.cluster.zones else ()):
            node["metadata"]["labels"][ZONE_LABEL] = f"z{i % s.cluster.zones}"
        pods = uniform_pods(s.workload.pods, cpu=s.workload.cpu, memory=s.workload.memory, scheduler_name=SCHEDULER_NAME)
        for pod in pods if s.workload.zone_spread_max_skew else ():
            pod["metadata"]["labels"] = {"app": SPREAD_APP}
            pod["spec"]["topologySpreadConstraints"] = [{
                "maxSkew": s.workload.zone_spread_max_skew, "topologyKey": ZONE_LABEL,
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": SPREAD_APP}}}]
        size = s.workload.gang_size
        for i, pod in enumerate(pods if size else ()):
            pod["metadata"].setdefault("labels", {})[POD_GROUP_LABEL] = f"gang-{i // size}"
        for pod in pods if s.workload.priority is not None else ():
            pod["spec"]["priority"] = s.workload.priority
        rate = s.workload.arrival_rate_per_s
        workload = [(s.workload.start_s + (i / rate if rate else 0.0), None, p) for i, p in enumerate(pods)]
        actions = {f.action for f in s.faults}
        self.own_redis = (EmbeddedRedis(appendonly=s.redis.appendonly)
                          if redis_url is None or s.redis.appendonly or "restart-redis" in actions else None)
        shard_options = ShardOptions(batch_size=s.shards.batch_size, max_batch_size=s.shards.max_batch_size,
                                     lease_ttl_ms=int(s.shards.lease_ttl_s * 1000),
                                     reservation_ttl_ms=int(s.shards.reservation_ttl_s * 1000),
                                     binding_cycles=s.shards.binding_cycles, seed=s.seed)
        options = RunOptions(shards=s.shards.count, shard_options=shard_options, redis_url=redis_url,
                             faults=s.binds.fault_config(), seed=s.seed, timeout_s=s.duration_s)
        super().__init__(load_config(GANG_CONFIG if size else CONFIG), nodes, workload, options, on_progress)
        #: fault proxies in front of Redis ("shards", "coordinator"), with redis.proxy
        self.proxies: dict[str, FaultProxy] = {}
        self.direct_redis_url = redis_url or ""  # the auditor's and the checks' way to Redis
        self.faults: list[FaultRecord] = []
        self.kills: list[KillRecord] = []
        self.rivals: list[Rival] = []
        self.shard_counters: dict[str, dict] = {}  # member -> last snapshot and metric samples
        self._handles: dict[str, ShardHostClient] = {}  # actor id -> every shard actor seen, zombies included
        self._last_status: dict[str, Any] = {}
        #: counters of dead coordinators (a new one starts from 0)
        self.carried = {"replaced_shards": 0, "requeues": 0}
        self.coordinator_samples: dict[str, list] = {}  # coordinator actor id -> its last metric samples
        self.t0_wall = 0.0
        self.settled = False
        self.ledger_check: dict[str, Any] = {}
        self.gang_counts: dict[str, int] = {}
        self.tracked_keys: set[str] = set()
        self.unbound_keys: list[str] = []
        self.audit: dict[str, Any] = {}
        self.final_status: dict[str, Any] = {}
        self.preemptions: dict[str, Any] = {}
        self.verdict: Verdict | None = None

    # ------------------------------------------------------------------ lifecycle
    def run_verdict(self) -> Verdict:
        """Run the scenario and judge it. The verdict's ``ok`` says whether every invariant held."""
        report = self.run()
        self.verdict = build_verdict(self, report)
        return self.verdict

    def _start(self) -> None:
        if self.own_redis is not None:
            try:
                self.own_redis.start()
            except ShardschedError as e:
                raise ShardschedError(f"could not start the scenario's Redis: {e}") from None
            self.options.redis_url = self.own_redis.url
        self.direct_redis_url = self.options.redis_url
        if self.scenario.redis.proxy:
            host_port = self.direct_redis_url.rsplit("@", 1)[-1].split("/")[0]
            host, port = host_port.rsplit(":", 1)
            self.proxies = {who: FaultProxy(host, int(port)).start() for who in ("shards", "coordinator")}
            self.options.shard_redis_url = self.proxies["shards"].url_for(self.direct_redis_url)
            self.options.redis_url = self.proxies["coordinator"].url_for(self.direct_redis_url)
        super()._start()
        rs = self.scenario.replica_sets
        for i in range(rs.sets if rs is not None else 0):
            template = uniform_pods(1, cpu=rs.cpu, memory=rs.memory, scheduler_name=SCHEDULER_NAME)[0]
            template["metadata"] = {"labels": {"app": f"{REPLICA_SET_APP}-{i}"}}
            template["spec"].update(priority=rs.priority, terminationGracePeriodSeconds=rs.termination_grace_period_s)
            self.cluster.create_replica_set(
                {"metadata": {"name": f"{REPLICA_SET_APP}-{i}"}, "spec": {"replicas": rs.replicas, "template": template}}
            ).wait(None)
        # the gangs' PodGroups exist before the workload's clock starts, so that neither their pods
        # nor the fault schedule wait behind them (300 one-by-one creates behind a 1,000 pods/s
        # feeder delayed every fault of gang-contention's long form by about 50 s)
        size = self.scenario.workload.gang_size
        groups = [{"metadata": {"name": f"gang-{g}"}, "spec": {"minMember": size}}
                  for g in range(self.scenario.workload.pods // size if size else 0)]
        for reply in [self.cluster.create_pod_group(group) for group in groups]:
            reply.wait(None)

    def _stop(self) -> None:
        for rival in self.rivals:
            rival.stop()
        try:
            super()._stop()
        finally:
            for proxy in self.proxies.values():
                proxy.stop()
            if self.own_redis is not None:
                self.own_redis.stop()

    def _new_cluster(self) -> ChaosClusterClient:
        actor = ray.remote(AuditedSimCluster).options(max_concurrency=MAX_CONCURRENCY, num_cpus=0).remote(
            self.direct_redis_url, self.prefix, seed=self.options.seed, faults=self.options.faults)
        return ChaosClusterClient(channel(actor))

    def coordinator_status(self) -> dict:
        """As `EmbeddedRun.coordinator_status`; counters of a coordinator that died are carried over."""
        restarts = self.coordinator_restarts
        status = super().coordinator_status()
        if self.coordinator_restarts != restarts:
            for f in self.faults:
                if f.action == "kill-coordinator" and "restarted_after_s" not in f.details:
                    f.details["restarted_after_s"] = round(time.time() - f.start, 2)  # a new one runs
            for k in self.carried:
                self.carried[k] += self._last_status.get(k, 0)
        self._last_status = status
        return status

    # ------------------------------------------------------------------ following the run
    def _follow(self, report: RunReport, t0: float, feeder: threading.Thread) -> None:
        self.t0_wall = time.time() - (time.monotonic() - t0)
        faults = threading.Thread(target=self._run_faults, args=(t0,), name="chaos-faults", daemon=True)
        faults.start()
        last_poll = 0.0
        quiet_until = 0.0
        while True:
            time.sleep(SAMPLE_S)
            elapsed = time.monotonic() - t0
            # read before the counts: pods created or faults done after this read count next time
            busy = faults.is_alive() or feeder.is_alive() or any(not r.done for r in self.rivals)
            status = self.coordinator_status()
            counts = self.cluster.chaos_progress().wait(None)
            if time.monotonic() - last_poll >= SHARD_POLL_S:
                self._poll_shards()
                last_poll = time.monotonic()
            self._note_replacements(status)
            if self.on_progress:
                self.on_progress(counts["bound"], len(self.workload), status)
            if busy:
                quiet_until = elapsed + QUIET_S
            settled = (not busy and elapsed >= quiet_until and counts["others_unbound"] == 0
                       and counts["unbound"] == status["unschedulable"] + status["invalid"]
                       and status["pending"] == status["unschedulable"] and not status["preemptors_waiting"]
                       and self._replaced_all(status))
            if settled:
                self.settled = True
                report.schedule_wall_s = elapsed
                return
            if elapsed > self.scenario.duration_s:
                report.errors.append(f"not settled within duration_s={self.scenario.duration_s:g}: "
                                     f"{counts['unbound']} of our pods unbound, {status['pending']} pending "
                                     f"({status['unschedulable']} unschedulable)")
                report.schedule_wall_s = elapsed
                return

    def _replaced_all(self, status: dict) -> bool:
        """Whether the health check has replaced every shard killed so far: a run whose pods all
        bound before the check saw a killed shard is not settled until it has (the scenario's
        fault is then exercised, not raced by a fast workload). A frozen shard may come back
        before it is replaced, so freezes are not waited for."""
        return self._replaced_by_health(status) >= sum(1 for f in self.faults if f.action == "kill-shard" and not f.error)

    def _replaced_by_health(self, status: dict) -> int:
        """Shards the health check replaced so far (the replacements that a ``replace-shard``
        fault made itself left out)."""
        return (status["replaced_shards"] + self.carried["replaced_shards"]
                - sum(1 for f in self.faults if f.action == "replace-shard" and not f.error))

    def _note_replacements(self, status: dict) -> None:
        """Time from a shard's kill or freeze to its replacement by the health check (sampled every
        `SAMPLE_S`; replacements are matched to kills and freezes in order)."""
        by_health = self._replaced_by_health(status)
        victims = [f for f in self.faults if f.action in ("kill-shard", "freeze-shard") and not f.error]
        for f in victims[:max(0, by_health)]:
            f.details.setdefault("replaced_after_s", round(time.time() - f.start, 2))

    def _poll_shards(self) -> None:
        """Keep every shard's (and coordinator's) latest snapshot and metric samples: a killed one's
        last numbers stay."""
        try:
            self.coordinator_samples[self.coordinator.channel.actor_id] = self.coordinator.metric_samples().wait(5)
        except ShardschedError:  # no answer (RemoteUnavailable), or it raised
            pass
        try:
            for shard in self._shard_clients(5):
                self._handles.setdefault(shard.channel.actor_id, shard)
        except ShardschedError:
            pass
        for key, shard in list(self._handles.items()):
            try:
                snap = shard.snapshot().wait(2)
                samples = shard.metric_samples().wait(2)
            except ShardschedError:
                continue
            self.shard_counters[snap["member"]] = {"snapshot": snap, "samples": samples}

    def created_at(self) -> dict[str, float]:
        """Pod key -> creation time (Unix s), as the feeder stamped our pods."""
        out = {}
        for _, _, pod in self.workload:
            created = ((pod.get("metadata") or {}).get("annotations") or {}).get(CREATED_AT_ANNOTATION)
            if created:
                out[f"{pod['metadata'].get('namespace') or 'default'}/{pod['metadata']['name']}"] = float(created)
        return out

    def _collect(self, report: RunReport) -> None:
        self._poll_shards()
        for rival in self.rivals:
            rival.stop()
            rival.join(10)
        super()._collect(report)
        self.final_status = self.coordinator_status()
        self.tracked_keys = set(self.coordinator.pending_keys().wait(None))
        self.unbound_keys = self.cluster.unbound_keys().wait(None)
        self.ledger_check = self._check_ledger()
        self.audit = self.cluster.audit().wait(None)
        self.preemptions = self.cluster.preemptions().wait(None)
        self.zone_counts = self.cluster.bound_per_label(ZONE_LABEL).wait(None) if self.scenario.cluster.zones else {}
        self.gang_counts = (self.cluster.bound_per_pod_label(POD_GROUP_LABEL).wait(None)
                            if self.scenario.workload.gang_size else {})

    def _check_ledger(self) -> dict[str, Any]:
        """docs/design.md invariant 5: every node's usage in the ledger equals its bound pods' requests
        and no reservation is left, once the reservations of the run's last binds have expired
        (polled until then: the coordinator observes the last binds a moment after the API)."""
        ledger = Ledger(connect(self.direct_redis_url), self.prefix)
        deadline = time.monotonic() + self.scenario.shards.reservation_ttl_s + 5.0
        while True:
            nodes = self.cluster.node_names().wait(None)
            truth = self.cluster.requested_all().wait(None)
            try:
                ledger.sweep(nodes)
                drift = {}
                for node in nodes:
                    usage = ledger.node_usage(node)
                    want = {r: v for r, v in truth.get(node, {}).items() if v}
                    used = {r: v for r, v in usage.used.items() if not is_device_resource(r)}  # sums only
                    if used != want or usage.reserved:
                        drift[node] = {"ledger_used": usage.used, "ledger_reserved": usage.reserved, "cluster": want}
            except ShardschedError as e:
                drift = {"(ledger unreadable)": {"error": str(e)}}
            if not drift or time.monotonic() > deadline:
                ledger.client.close()
                return {"nodes": len(nodes), "drift_nodes": len(drift), "examples": dict(list(drift.items())[:3])}
            time.sleep(0.5)

    # ------------------------------------------------------------------ faults
    def _run_faults(self, t0: float) -> None:
        """Execute the schedule: (time, seq, action, args, k) events; timed faults queue their undo."""
        events: list[tuple[float, int, str, Any, int]] = []
        seq = 0
        for step in self.scenario.faults:
            for k, at in enumerate(step.times_s()):
                events.append((at, seq, step.action, step.parsed_args(), k))
                seq += 1
        heapq.heapify(events)
        while events:
            at, _, action, args, k = heapq.heappop(events)
            delay = t0 + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if callable(action):  # the end of a timed fault
                action()
                continue
            record = FaultRecord(action, time.time())
            self.faults.append(record)
            try:
                undo = getattr(self, f"_fault_{action.replace('-', '_')}")(args, k, record)
            except Exception as e:  # noqa: BLE001 - a failed fault is reported, the run goes on
                record.error = f"{type(e).__name__}: {e}"
                record.end = time.time()
                log.exception("fault %s failed", action)
                continue
            if undo is None:
                record.end = time.time()
                continue
            for_s, fn = undo

            def finish(fn=fn, record=record) -> None:
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - reported in the verdict
                    record.error = f"undo: {type(e).__name__}: {e}"
                record.end = time.time()

            seq += 1
            heapq.heappush(events, (at + for_s, seq, finish, None, 0))

    def _shard(self, index: int) -> ShardHostClient:
        shards = self._shard_clients(10)
        return shards[index % len(shards)]

    def _fault_kill_shard(self, args, k: int, record: FaultRecord):
        shards = self._shard_clients(10)
        index = (args.index if args.index is not None else k) % len(shards)
        shard = shards[index]
        keys = shard.pending_keys().wait(5)
        member = shard.ping().wait(5)
        pid = shard.pid().wait(5)
        self._handles.setdefault(shard.channel.actor_id, shard)
        os.kill(pid, signal.SIGKILL)
        record.details = {"index": index, "member": member, "pods_held": len(keys)}
        self.kills.append(KillRecord(index, member, record.start, keys))

    def _fault_kill_coordinator(self, args, k: int, record: FaultRecord):
        pid = self.coordinator.pid().wait(10)
        os.kill(pid, signal.SIGKILL)
        record.details = {"pid": pid}

    def _fault_restart_redis(self, args, k: int, record: FaultRecord):
        self.own_redis.restart(crash=args.crash, down_s=args.down_s)
        record.details = {"crash": args.crash, "appendonly": self.own_redis.appendonly, "down_s": args.down_s}

    def _proxies(self, who: str) -> list[FaultProxy]:
        return list(self.proxies.values()) if who == "all" else [self.proxies[who]]

    def _fault_redis_latency(self, args, k: int, record: FaultRecord):
        proxies = self._proxies(args.who)
        client = connect(proxies[0].url_for(self.direct_redis_url))
        client.ping()  # connected before the delay, so that the probe below is one round trip
        for proxy in proxies:
            proxy.set_latency(args.latency_ms / 1000)
        record.details = {"who": args.who, "latency_ms": args.latency_ms}

        def probe() -> None:  # what a shard's round trip to Redis now takes
            try:
                record.details["ping_ms"] = round(measure_ping_s(client, 1) * 1000, 1)
            finally:
                client.close()

        threading.Thread(target=probe, name="latency-probe", daemon=True).start()

        def restore() -> None:
            for proxy in proxies:
                proxy.set_latency(0.0)

        return args.for_s, restore

    def _fault_partition_redis(self, args, k: int, record: FaultRecord):
        proxies = self._proxies(args.who)
        refused = sum(p.refused for p in proxies)
        for proxy in proxies:
            proxy.partition()
        record.details = {"who": args.who}

        def heal() -> None:
            for proxy in proxies:
                proxy.heal()
            record.details["refused"] = sum(p.refused for p in proxies) - refused  # reconnects turned away

        return args.for_s, heal

    def _fault_replace_shard(self, args, k: int, record: FaultRecord):
        old = self._shard(args.index)
        self._handles.setdefault(old.channel.actor_id, old)
        old_member = old.ping().wait(5)
        member = self.coordinator.replace_shard(args.index).wait(30)
        record.details = {"index": args.index, "stale_owner": old_member, "new_owner": member}

    def _fault_freeze_shard(self, args, k: int, record: FaultRecord):
        shard = self._shard(args.index)
        self._handles.setdefault(shard.channel.actor_id, shard)
        member = shard.ping().wait(5)
        pid = shard.pid().wait(5)
        os.kill(pid, signal.SIGSTOP)
        record.details = {"index": args.index, "member": member}
        return args.for_s, lambda: os.kill(pid, signal.SIGCONT)

    def _fault_bind_faults(self, args, k: int, record: FaultRecord):
        before = self.cluster.faults().wait(None)
        self.cluster.set_faults(args.fault_config()).wait(None)
        record.details = args.model_dump(exclude={"for_s"})
        if args.for_s is not None:
            return args.for_s, lambda: self.cluster.set_faults(before).wait(None)
        return None

    def _fault_delete_pods(self, args, k: int, record: FaultRecord):
        keys = self.cluster.delete_random_pods(args.count, args.state).wait(None)
        record.details = {"state": args.state, "deleted": len(keys)}

    def _fault_delete_nodes(self, args, k: int, record: FaultRecord):
        names = self.cluster.delete_random_nodes(args.count).wait(None)
        record.details = {"deleted": len(names)}

    def _fault_add_nodes(self, args, k: int, record: FaultRecord):
        c = self.scenario.cluster
        nodes = uniform_nodes(args.count, cpu=c.cpu, memory=c.memory, pods=c.max_pods, prefix=f"node-add{k}-")
        self.cluster.create_nodes(nodes).wait(None)
        record.details = {"added": args.count}

    def _fault_rival(self, args, k: int, record: FaultRecord):
        c = self.scenario.cluster
        names = sorted(self.cluster.node_names().wait(None))[: args.nodes]
        alloc = {"cpu": canonical_quantity("cpu", c.cpu), "memory": canonical_quantity("memory", c.memory),
                 "pods": c.max_pods}
        ledger = Ledger(connect(self.direct_redis_url), self.prefix)
        rival = Rival(self.cluster.channel.target, ledger, args, names, {n: alloc for n in names}, f"rival{len(self.rivals)}",
                      self.scenario.seed + 7 + k, int(self.scenario.shards.lease_ttl_s * 1000))
        self.rivals.append(rival.start())
        record.details = {"mode": args.mode, "pods": args.pods, "nodes": len(names)}
        return args.pods / args.rate_per_s, lambda: None
