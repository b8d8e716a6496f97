"""The verdict of a chaos run: the invariants of docs/design.md checked on what the API server saw, the
throughput around the faults, and the counters that explain them.

Sources, none of them the scheduler's own opinion where an invariant is concerned:

- the API's bind log (`chaos.audit.AuditedSimCluster`): every applied bind with its time, binder,
  fencing verdict (checked against the ledger when the bind was applied) and admission outcome;
- the cluster at the end (pods without a node) and the coordinator's pending pods (a pod nobody
  tracks is lost);
- the ledger compared node by node with the cluster (`ChaosRun._check_ledger`);
- the shards' and the coordinator's metrics (polled during the run, so a killed shard's last
  numbers count) for the explanation.

Definitions:

- ``overcommitted_nodes``: nodes where the kubelet-like admission rejected a pod bound by a
  scheduler that goes through the ledger (shards, or a ledger-respecting rival), plus nodes whose
  bound pods exceed allocatable. A node where a bypassing rival had bound pods before the rejection
  is counted under ``rival.bypass`` instead: that overcommit is the rival's, detected by admission.
- ``double_binds``: binds applied to a pod already bound (the API's own count and the bind log's).
- ``stale_token_binds``: binds applied while the pod's lease was missing or expired, or held with a
  token other than the one of the pod's reservation on that node (`chaos.audit.STALE`).
- ``lost_pods``: pods of ours without a node at the end that the coordinator does not track;
  a run that does not settle by its deadline also fails ``no_lost_pods`` (pods stuck pending).
- ``recovery_s``: per fault, from its start to the first moment from which the bind rate (in 1 s
  windows) stays at 90 % or more of the pre-fault rate for 2 s (the rate from the first bind to the
  first fault; the 5 s before the fault when the first fault came too early for that): 0 when
  the fault made no dent; for a fault that lasts (a partition), the time after its end is also
  given (``recovery_after_end_s``). The verdict's ``recovery_s`` is the largest. None when it could
  not be measured (no rate before the fault, or the work ran out first).
- ``pods_per_s``: before the first fault, during the faults (first start to last end), after.
- ``preemption`` (a scenario with a ``preemption`` block; the workload's pods are the preemptors):
  from the victims' ``Preempted`` Events, the victims per preemptor (each at most
  `Scenario.minimum_victims`), any victim deleted more than once for the same preemptor, and the
  time from each preemptor's creation to its bind (at most ``bound_within_s``, every one bound).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from chaos.audit import BYPASS, SCHEDULER, STALE
from chaos.scenario import INVARIANTS, REPLICA_SET_APP
from shardsched.sim import SCHEDULER_NAME

if TYPE_CHECKING:
    from chaos.runner import ChaosRun
    from shardsched.sharding.run_report import RunReport

WINDOW_S = 1.0
STAY_S = 2.0
BEFORE_S = 5.0
RECOVERED = 0.9
KILL_GRACE_S = 5.0


@dataclass
class Verdict:
    """The verdict (see module docstring); `to_json` is the ``-o json`` contract."""

    data: dict[str, Any]
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "violations": self.violations, **self.data}


def _sum_samples(families: list, sample: str, label: str) -> Counter:
    out: Counter = Counter()
    for _, _, _, samples in families:
        for name, labels, value in samples:
            if name == sample:
                out[labels.get(label, "")] += int(value)
    return out


def _rate(times: np.ndarray, start: float, end: float) -> float | None:
    if end - start < WINDOW_S:
        return None
    return float(((times >= start) & (times < end)).sum() / (end - start))


def _recovery(times: np.ndarray, start: float, first_bind: float,
              reference: float | None = None) -> tuple[float | None, float | None]:
    """(the pre-fault rate: ``reference``, or else the bind rate in the `BEFORE_S` before ``start``;
    seconds from ``start`` to the first moment from which the rate is back at `RECOVERED` of it for
    `STAY_S`, in 1 s windows): 0 when the fault made no dent; None when there was no rate before,
    or the work ran out first."""
    before = reference or _rate(times, max(first_bind, start - BEFORE_S), start)
    if not before:
        return before, None
    last = float(times[-1]) if len(times) else start
    t = start
    while t + STAY_S <= last + 1e-9:
        if all(((times >= w) & (times < w + WINDOW_S)).sum() / WINDOW_S >= RECOVERED * before
               for w in np.arange(t, t + STAY_S - 1e-9, WINDOW_S)):
            return before, round(t - start, 2)
        t += 0.1
    return before, None


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    """Numbers of nested dicts and lists by dotted path (``faults.0.refused``); for ``exercised``."""
    if isinstance(value, (dict, list)):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = value


def _preemption(run: "ChaosRun", bound_at: dict[str, float]) -> dict[str, Any]:
    """The ``preemption`` part of the verdict (module docstring): victims per preemptor from the
    ``Preempted`` Events, and the preemptors' (the workload's pods') creation -> bind times."""
    found = run.preemptions
    uids = found.get("uids", {})
    per: dict[str, set[str]] = defaultdict(set)
    again = []
    for victim, victim_uid, preemptor_uid, node, count in found.get("victims", []):
        per[preemptor_uid].add(victim_uid or victim)
        if count > 1:
            again.append(victim)
    created = run.created_at()
    waits = [bound_at[k] - c for k, c in created.items() if k in bound_at]
    most = max(per.items(), key=lambda kv: len(kv[1]), default=("", set()))
    return {
        "minimum_victims": run.scenario.minimum_victims(),
        "preemptors": len(per), "victims": sum(len(vs) for vs in per.values()),
        "victims_max_per_preemptor": len(most[1]),
        "victims_per_preemptor": dict(sorted(Counter(len(vs) for vs in per.values()).items())),
        "deleted_again": len(again),
        "bound_within_max_s": round(max(waits), 2) if waits else 0.0,
        "preemptors_unbound": sum(1 for k in created if k not in bound_at),
        "limit_s": run.scenario.preemption.bound_within_s,
        "examples": {"most_victims": f"{uids.get(most[0], most[0])}: {len(most[1])} victims",
                     "deleted_again": again[:5]},
    }


def build_verdict(run: "ChaosRun", report: "RunReport") -> Verdict:
    s = run.scenario
    t0 = run.t0_wall
    log = run.audit.get("log", [])
    fence_counts = run.audit.get("verdicts", {})

    # ---- binds as the API applied them
    ours = sorted(e[0] - t0 for e in log if e[7] == SCHEDULER_NAME and e[3] == SCHEDULER)
    times = np.asarray(ours)
    first_bind = float(times[0]) if len(times) else 0.0
    bound_at: dict[str, float] = {}
    binds_per_key: Counter = Counter()
    bypass_since: dict[str, float] = {}
    for t, key, node, binder, *_ in log:
        binds_per_key[key] += 1
        bound_at.setdefault(key, t)
        if binder == BYPASS:
            bypass_since.setdefault(node, t)
    over_nodes, bypass_nodes = set(), set()
    rejected = Counter()
    for t, key, node, binder, fence, phase, reason, sched in log:
        if phase != "Failed" or not reason.startswith("OutOf"):
            continue
        if binder == BYPASS:
            rejected["rival_pods"] += 1
            bypass_nodes.add(node)
        elif node in bypass_since and bypass_since[node] <= t:
            rejected["ours_on_bypassed_nodes" if sched == SCHEDULER_NAME else "ledger_rival_on_bypassed_nodes"] += 1
            bypass_nodes.add(node)
        else:
            rejected["through_the_ledger"] += 1
            over_nodes.add(node)
    over_nodes |= set(report.invariants.get("overcommitted_nodes", ()))
    stale = [e for e in log if e[3] == SCHEDULER and e[4] in STALE]
    double = max(int(report.invariants.get("double_binds", 0)), sum(1 for n in binds_per_key.values() if n > 1))

    # ---- pods at the end
    unbound = set(run.unbound_keys)
    lost = sorted(unbound - run.tracked_keys)
    status = run.final_status

    # ---- faults: recovery and throughput
    faults_out = []
    recoveries = []
    first_fault = min((f.start for f in run.faults), default=None)
    # the steady rate before the first fault is the reference for every fault (a later fault's own
    # "before" would include the catch-up burst after the previous one)
    reference = _rate(times, first_bind, first_fault - t0) if first_fault is not None else None
    for f in run.faults:
        start, end = f.start - t0, (f.end or f.start) - t0
        before, rec = _recovery(times, start, first_bind, reference)
        faults_out.append({"action": f.action, "at_s": round(start, 2), "end_s": round(end, 2),
                           "rate_before": round(before, 1) if before else before, "recovery_s": rec,
                           "recovery_after_end_s": round(max(0.0, rec - (end - start)), 2) if rec is not None else None,
                           **f.details, **({"error": f.error} if f.error else {})})
        if rec is not None:
            recoveries.append(rec)
    if run.faults:
        f_start = min(f.start for f in run.faults) - t0
        f_end = max(max((f.end or f.start) for f in run.faults) - t0, f_start + WINDOW_S)
    else:
        f_start = f_end = float(times[-1]) if len(times) else 0.0
    last_bind = float(times[-1]) if len(times) else 0.0
    pods_per_s = {"before": _rate(times, first_bind, f_start), "during": _rate(times, f_start, f_end),
                  "after": _rate(times, f_end, last_bind)}
    pods_per_s = {k: round(v, 1) if v is not None else None for k, v in pods_per_s.items()}

    # ---- killed shards' pods (invariant 4): those it held when killed, and those created until the
    # next kill or the limit (the coordinator routes some of them to the dead shard until it replaces
    # it); each waits from the kill or from its creation, whichever is later
    kills_out = []
    limit = s.shards.lease_ttl_s + KILL_GRACE_S
    created = run.created_at()
    background = f"default/{REPLICA_SET_APP}-"  # a replica set's pods (`ReplicaSetsSpec`): not counted
    for i, kill in enumerate(run.kills):
        until = min(run.kills[i + 1].at if i + 1 < len(run.kills) else kill.at + limit, kill.at + limit)
        held = set(kill.keys) - (set(run.kills[i + 1].keys) if i + 1 < len(run.kills) else set())
        held = {k for k in held if not (s.replica_sets is not None and k.startswith(background))}
        keys = held | {k for k, c in created.items() if kill.at <= c < until}
        waits = [bound_at[k] - max(kill.at, created.get(k, 0.0)) for k in keys if k in bound_at]
        pending = [k for k in keys if k not in bound_at and k in unbound]
        kills_out.append({"index": kill.index, "member": kill.member, "at_s": round(kill.at - t0, 2),
                          "pods_held": len(kill.keys), "pods_counted": len(keys),
                          "bound_within_s": round(max(waits), 2) if waits else 0.0,
                          "still_pending": len(pending), "limit_s": limit})

    # ---- metrics that explain
    shard_fams = [c["samples"] for c in run.shard_counters.values()]
    reserve = Counter()
    permit = Counter()
    binds = Counter()
    leases = Counter()
    shard_requeues = Counter()
    for fams in shard_fams:
        reserve += _sum_samples(fams, "shardsched_ledger_reserve_total", "code")
        permit += _sum_samples(fams, "shardsched_ledger_permit_total", "code")
        binds += _sum_samples(fams, "shardsched_bind_total", "result")
        leases += _sum_samples(fams, "shardsched_lease_acquire_total", "result")
        shard_requeues += _sum_samples(fams, "shardsched_rebalancer_requeues_total", "reason")
    coord_requeues = Counter()
    for fams in run.coordinator_samples.values():
        coord_requeues += _sum_samples(fams, "shardsched_rebalancer_requeues_total", "reason")
    metrics = {
        "requeues": int(status.get("requeues", 0)) + run.carried["requeues"] + sum(shard_requeues.values()),
        "requeues_by_reason": dict(coord_requeues + shard_requeues),
        "conflicts": binds.get("conflict", 0),
        "reserve_results": dict(reserve),
        "reserve_failures_by_code": {k: v for k, v in reserve.items() if k != "OK"},
        "permit_failures_by_code": {k: v for k, v in permit.items() if k != "OK"},
        "bind_results": dict(binds),
        "lease_held_elsewhere": leases.get("held_elsewhere", 0),
        "lease_lost_before_bind": leases.get("lost", 0),
        "replaced_shards": int(status.get("replaced_shards", 0)) + run.carried["replaced_shards"],
        #: nodes the (last) coordinator nominated over the whole cluster (pods a shard cannot check alone)
        "nominated": int(status.get("nominated", 0)),
        #: preemptions (nominations with their victims deleted) and victims deleted, by the (last) coordinator
        "preemptions": int(status.get("preemptions", 0)),
        "victims": int(status.get("victims", 0)),
        "coordinator_restarts": run.coordinator_restarts,
        "ledger_rebuilds": int(status.get("ledger_rebuilds", 0)),
        "admission_rejections": int(report.invariants.get("admission_rejections", 0)),
        "admission_rejections_by_cause": dict(rejected),
        "injected_bind_faults": report.invariants.get("injected_faults", {}),
        "fence_verdicts": fence_counts,
        "unverified_binds": fence_counts.get("unverified", 0),
        "stale_epoch_binds": fence_counts.get("stale_epoch", 0),
        "shards_polled": len(run.shard_counters),
    }
    rivals = [r.report() for r in run.rivals]
    rival_out = None
    if rivals:
        rival_out = {"runs": rivals, "bypass": {"overcommitted_nodes": len(bypass_nodes),
                                                "rival_pods_rejected": rejected["rival_pods"],
                                                "our_pods_rejected": rejected["ours_on_bypassed_nodes"]}}

    data = {
        "scenario": s.name, "short": run.short, "seed": s.seed, "settled": run.settled,
        "overcommitted_nodes": len(over_nodes), "double_binds": double, "stale_token_binds": len(stale),
        "lost_pods": len(lost), "recovery_s": max(recoveries) if recoveries else None,
        "pods_per_s": pods_per_s,
        #: our pods bound in each second of the run, from the start of the workload (binds before
        #: it, of pods set up with the cluster such as a scenario's replica sets, count in second 0)
        "binds_per_second": np.bincount(np.clip(times, 0, None).astype(int)).tolist() if len(times) else [],
        "pods": {"total": report.pods_total, "bound": len(times),
                 "unbound": len(unbound), "unschedulable": int(status.get("unschedulable", 0)),
                 "pending": int(status.get("pending", 0)) - int(status.get("unschedulable", 0))},
        "faults": faults_out,
        "shard_kills": kills_out,
        "metrics": metrics,
        "rival": rival_out,
        "ledger": run.ledger_check,
        "nodes": s.cluster.nodes, "shards": s.shards.count, "wall_s": round(report.wall_s, 1),
        "examples": {"overcommitted_nodes": sorted(over_nodes)[:5], "lost_pods": lost[:5],
                     "stale_binds": [{"at_s": round(e[0] - t0, 3), "pod": e[1], "node": e[2], "fence": e[4]}
                                     for e in stale[:5]],
                     "stale_epoch_binds": sorted({round(e[0] - t0, 1) for e in log if e[4] == "stale_epoch"})[:10]},
        "errors": report.errors + [f"{f.action}: {f.error}" for f in run.faults if f.error],
    }

    # ---- judge
    v: list[str] = []
    wanted = set(s.invariants)
    if "no_overcommit" in wanted and over_nodes:
        v.append(f"no_overcommit: {len(over_nodes)} nodes overcommitted through the ledger")
    if "no_double_bind" in wanted and double:
        v.append(f"no_double_bind: {double} double binds")
    if "no_stale_token_bind" in wanted and stale:
        v.append(f"no_stale_token_bind: {len(stale)} binds applied under a stale token "
                 f"({dict(Counter(e[4] for e in stale))})")
    if "no_lost_pods" in wanted:
        if lost:
            v.append(f"no_lost_pods: {len(lost)} pods unbound and tracked by nobody")
        if not run.settled:
            v.append(f"no_lost_pods: the run did not settle within {s.duration_s:g} s "
                     f"({data['pods']['pending']} pods still pending)")
    if "shard_recovery" in wanted:
        for k in kills_out:
            if k["bound_within_s"] > limit or k["still_pending"]:
                v.append(f"shard_recovery: shard {k['member']} killed at {k['at_s']} s: its pods bound within "
                         f"{k['bound_within_s']} s (limit {limit:g}), {k['still_pending']} not bound")
    if "ledger_converges" in wanted and run.ledger_check.get("drift_nodes"):
        v.append(f"ledger_converges: {run.ledger_check['drift_nodes']} nodes differ from the cluster")
    skew = s.workload.zone_spread_max_skew
    if skew is not None:
        counts = run.zone_counts
        data["zone_spread"] = {"max_skew": skew, "bound_per_zone": counts,
                               "skew": max(counts.values()) - min(counts.values()) if counts else 0}
        # with pods still in flight the counts are not final (nominations count pods not yet bound)
        data["zone_spread"]["checked"] = run.settled
        if "spread_holds" in wanted and run.settled and data["zone_spread"]["skew"] > skew:
            v.append(f"spread_holds: bound pods per zone {counts} differ by more than maxSkew {skew}")
    size = s.workload.gang_size
    if size is not None:
        counts = run.gang_counts
        partial = sorted(g for g, n in counts.items() if 0 < n < size)
        data["gangs"] = {"size": size, "count": len(counts), "whole": sum(1 for n in counts.values() if n == size),
                         "none_bound": sum(1 for n in counts.values() if n == 0), "partial": partial,
                         "checked": run.settled}
        if "gangs_whole" in wanted and run.settled and partial:
            v.append(f"gangs_whole: {len(partial)} gangs partly bound: {', '.join(partial[:10])}")
    if s.preemption is not None:
        data["preemption"] = _preemption(run, bound_at)
        p = data["preemption"]
        if "preemption_bounded" in wanted:
            if p["victims_max_per_preemptor"] > p["minimum_victims"]:
                v.append(f"preemption_bounded: a preemptor deleted {p['victims_max_per_preemptor']} victims, "
                         f"{p['minimum_victims']} suffice ({p['examples']['most_victims']})")
            if p["deleted_again"]:
                v.append(f"preemption_bounded: {p['deleted_again']} victims deleted more than once for the same "
                         f"preemptor ({p['examples']['deleted_again']})")
            if p["preemptors_unbound"] or p["bound_within_max_s"] > s.preemption.bound_within_s:
                v.append(f"preemption_bounded: preemptors bound within {p['bound_within_max_s']} s (limit "
                         f"{s.preemption.bound_within_s:g}), {p['preemptors_unbound']} not bound")
    flat: dict[str, float] = {}
    _flatten("", data, flat)
    exercised = {}
    for path, minimum in s.exercised.items():
        value = flat.get(path, 0)
        exercised[path] = {"value": value, "min": minimum}
        if value < minimum:
            v.append(f"exercised: {path} = {value} < {minimum:g}: the fault did not happen as the scenario says")
    data["exercised"] = exercised
    data["invariants_checked"] = {name: INVARIANTS[name] for name in s.invariants}
    if data["errors"]:
        v.append(f"errors: {len(data['errors'])} (see errors)")
    return Verdict(data, v)
