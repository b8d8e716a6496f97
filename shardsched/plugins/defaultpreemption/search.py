"""DefaultPreemption's victim search vectorized over nodes.

Upstream's ``SelectVictimsOnNode`` runs the Filters on one node per potential victim. Where the
only Filter that removing pods can change is the resource fit, the same answer comes from arrays:

- `plan`: per node looked at, the requests of its pods of lower priority (`PodColumns`), so that
  one comparison over all nodes says where the pod has no victim (`NO_VICTIMS`), where it does not
  fit even with all of them gone (`NO_FIT`, with the resources that fall short) and where it does
  (`FEASIBLE`);
- `reprieve`: for the feasible nodes of a stretch of the search, the potential victims sorted per
  node in MoreImportantPod order (ties in the node's pod order), the PDB split done with grouped
  cumulative sums, then the pods put back in that order, every node at once, one pod per node per
  step, each kept when the pod still fits.

A node goes to the per-node search (`EXACT`) when another Filter could change with its pods: a
Filter that does not say it `passes_without_pods` (required pod affinity does not) is in the
profile, or the node fails some other Filter now (ports, anti-affinity, spread skew), or the pod
fits it as it is. No PreFilter rejection, one resource Filter: otherwise every node is `EXACT`.

A GPU device Filter (`FilterPlugin.device_check`, GPUDevice's) is checked the same way, per
device: each pod of lower priority frees the thousandths it holds on its own devices, so the free
devices with all of them gone, and after each one put back, are rows of arrays too; the pod fits
when ONE device has its share free (or enough devices are wholly free), never over two devices.
The results are those of the per-node search (the tests compare them on random clusters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.api.objects import PodInfo
from shardsched.api.quantity import PODS
from shardsched.cache.devices import DeviceRequest
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import FilterPlugin, PostFilterHandle, ResourceCheck

#: how the search sees a node it looks at (`Plan.kind`)
NO_VICTIMS, NO_FIT, EXACT, FEASIBLE = 0, 1, 2, 3
PRIORITY_OFFSET = 2**31  # upstream adds MaxInt32 + 1 so that negative priorities sum sensibly


@dataclass(slots=True)
class Plan:
    """The nodes looked at, in order (``order``: table slots), and what the arrays say of each.

    Attributes:
        kind: int8 per position of ``order``: NO_VICTIMS, NO_FIT, EXACT or FEASIBLE.
        check: the resource Filter's check, None when every node with victims is EXACT.
        short: bool (len(check.rows), table slots [0, n)): the resource falls short even with every
            pod of lower priority gone (read on NO_FIT nodes).
        free_all: int64 (len(check.rows), table slots): allocatable - requested + the lower-priority
            pods' requests (read on FEASIBLE nodes).
    """

    order: np.ndarray
    kind: np.ndarray
    check: ResourceCheck | None = None
    short: np.ndarray | None = None
    free_all: np.ndarray | None = None
    device: "DeviceFit | None" = None


@dataclass(slots=True)
class DeviceFit:
    """The device Filter of a `Plan` (`FilterPlugin.device_check`).

    Attributes:
        request: the pod's devices.
        free_all: int64 (table slots, device width): each device's free thousandths with every pod
            of lower priority gone.
        short: bool per table slot: no device set fits even then.
        reason_first: bool per table slot: on a node that does not fit even then, the device
            Filter's reasons are the node's (it runs before the resource Filter, or the resources
            fit); else the resource Filter's.
        plugin: the Filter, for its reasons (`FilterPlugin.failure_reasons`).
        state: the cycle state its reasons read.
    """

    request: DeviceRequest
    free_all: np.ndarray
    short: np.ndarray
    reason_first: np.ndarray
    plugin: FilterPlugin
    state: CycleState


def _devices_below(table, cols, priority: int, n: int) -> np.ndarray:
    """int64 (n, device width): per node slot, the thousandths its pods of priority below
    ``priority`` hold on each device."""
    out = np.zeros((n, table.devices.width), np.int64)
    rows = cols.rows_below(priority, np.ones(n, bool))
    _add_devices(out, cols.slot[rows].tolist(), [cols.usage[r] for r in rows.tolist()])
    return out


def _add_devices(out: np.ndarray, at: list[int], usages: list) -> None:
    """Add to ``out[at[i]]`` the thousandths ``usages[i]`` holds on each of its devices."""
    where, device, milli = [], [], []
    for i, u in zip(at, usages):
        gpu = u.gpu
        if gpu is not None:
            for d in u.devices:
                where.append(i)
                device.append(d)
                milli.append(gpu.milli)
    if where:
        np.add.at(out, (np.array(where), np.array(device)), np.array(milli, np.int64))


def exact_plan(pod: PodInfo, handle: PostFilterHandle, order: np.ndarray) -> Plan:
    """Every node to the per-node search."""
    return Plan(order, np.full(len(order), EXACT, np.int8))


def plan(pod: PodInfo, handle: PostFilterHandle, order: np.ndarray) -> Plan:
    """Classify the nodes of ``order`` (table slots) for ``pod`` (module docstring). Reads the
    table, runs the profile's PreFilters and the non-resource Filters once over every node."""
    p = classify(pod, handle)
    return Plan(order, p.kind[order], p.check, p.short, p.free_all, p.device)


def classify(pod: PodInfo, handle: PostFilterHandle, where: np.ndarray | None = None) -> Plan:
    """`plan` over table slots: the answer's ``order`` is ``where`` (every slot [0, n) when None)
    and its ``kind``, ``short`` and ``free_all`` are aligned with it (columns, for ``short`` and
    ``free_all``). The non-resource Filters run on those slots only. ``check`` is None when every
    node with victims is EXACT, whatever the slots (the profile, the pod, a PreFilter rejection)."""
    table = handle.table
    n = table.n
    at = np.arange(n) if where is None else where
    below = table.pod_columns().requested_below(pod.priority, n, where)
    if below is None:
        return Plan(at, np.full(len(at), NO_VICTIMS, np.int8))
    has_victims = below[table.resource_row(PODS)] > 0
    kind = np.where(has_victims, EXACT, NO_VICTIMS).astype(np.int8)
    state, filters, st = handle.pre_filter(pod)
    if not st.is_success():
        return Plan(at, kind)
    checks = [(f, f.resource_check(state)) for f in filters]
    fits = [c for f, c in checks if c is not None]
    devices = [(i, f, f.device_check(state)) for i, (f, c) in enumerate(checks) if c is None]
    devices = [d for d in devices if d[2] is not None]
    others = [f for f, c in checks if c is None and not any(f is d[1] for d in devices)]
    if len(fits) != 1 or len(devices) > 1 or not all(f.passes_without_pods(pod) for f in others):
        return Plan(at, kind)
    check = fits[0]
    others_ok = np.ones(len(at), bool)
    for f in others:
        others_ok &= f.filter(state, pod, table, slice(0, n) if where is None else where)
    rows = list(check.rows)
    need = np.array(check.requests, np.int64)[:, None]
    cells = np.ix_(rows, at)
    free_now = table.alloc[cells] - table.requested[cells]
    free_all = free_now + below[rows]
    short = free_all < need
    fits_now = (free_now >= need).all(axis=0)
    no_fit = short.any(axis=0)
    device = None
    if devices:
        (index, plugin, request), = devices
        dev_now = table.devices.free[at].astype(np.int64)
        dev_free_all = dev_now + _devices_below(table, table.pod_columns(), pod.priority, n)[at]
        dev_short = ~request.fits_free(dev_free_all)
        fits_now &= request.fits_free(dev_now)
        resource_at = next(i for i, (f, c) in enumerate(checks) if c is not None)
        first = np.full(len(at), index < resource_at) | ~no_fit
        device = DeviceFit(request, dev_free_all, dev_short, first, plugin, state)
        no_fit = no_fit | dev_short
    feasible = np.where(no_fit, NO_FIT, FEASIBLE).astype(np.int8)
    kind = np.where(has_victims & others_ok & ~fits_now, feasible, kind)
    return Plan(at, kind, check, short, free_all, device)


@dataclass(slots=True)
class Reprieved:
    """`reprieve`'s answer for positions ``positions`` of a plan (arrays aligned with them).

    Attributes:
        victims: int64 per position, the number of victims (0 only if the pod fits with every pod).
        violations: int64, victims that break a PodDisruptionBudget.
        first_priority: int64, the priority of the first victim (order below).
        priority_sum: int64, the sum of the victims' priorities, each + 2^31.
        earliest_top_start_s: float64, the earliest start among the highest-priority victims.
        rows: `PodColumns` rows of all the victims, position after position, each position's in
            the order they were chosen (PDB-violating first, each group most important first);
            ``begin``: int64, where each position's start in ``rows``.
    """

    victims: np.ndarray
    violations: np.ndarray
    first_priority: np.ndarray
    priority_sum: np.ndarray
    earliest_top_start_s: np.ndarray
    rows: np.ndarray
    begin: np.ndarray


class PdbMembers:
    """Which budgets each pod counts against (`split_by_pdb`'s test: selected, and not among the
    budget's ``disruptedPods``), remembered per pod uid while the budgets stay equal."""

    def __init__(self) -> None:
        self._pdbs: tuple[PodDisruptionBudget, ...] = ()
        self._by_uid: dict[str, tuple[bool, ...]] = {}

    def matrix(self, pdbs: tuple[PodDisruptionBudget, ...], usages: list, limit: int) -> np.ndarray:
        """bool (len(usages), len(pdbs)); ``limit``: forget everything past this many pods."""
        if pdbs != self._pdbs or len(self._by_uid) > limit:
            self._pdbs, self._by_uid = pdbs, {}
        memo = self._by_uid
        out = []
        for u in usages:
            hit = memo.get(u.uid)
            if hit is None:
                name = u.key.split("/", 1)[1] if "/" in u.key else u.key
                hit = memo[u.uid] = tuple(bool(u.labels) and p.selects(u.namespace, u.labels)
                                          and name not in p.disrupted_pods for p in pdbs)
            out.append(hit)
        return np.array(out, bool).reshape(len(usages), len(pdbs))


def reprieve(pod: PodInfo, handle: PostFilterHandle, p: Plan, positions: np.ndarray,
             members: PdbMembers) -> Reprieved:
    """``SelectVictimsOnNode`` for the FEASIBLE ``positions`` of ``p``, all at once (module
    docstring); the table is only read."""
    table = handle.table
    cols = table.pod_columns()
    assert p.check is not None and p.free_all is not None
    slots = p.order[positions]
    on = np.zeros(table.n, bool)
    on[slots] = True
    rows = cols.rows_below(pod.priority, on)
    slot = cols.slot[rows]
    rows = rows[np.lexsort((cols.order[rows], cols.start_s[rows], -cols.priority[rows], slot))]
    slot = cols.slot[rows]
    n = len(rows)
    bounds = np.flatnonzero(np.concatenate(([True], slot[1:] != slot[:-1])))
    lengths = np.diff(np.append(bounds, n))
    group = np.repeat(np.arange(len(bounds)), lengths)
    violating = np.zeros(n, bool)
    pdbs = tuple(handle.pdbs)
    if pdbs:
        m = members.matrix(pdbs, [cols.usage[r] for r in rows.tolist()], 4 * len(table.pod_slot) + 1024)
        first = bounds[group]
        for i, pdb in enumerate(pdbs):
            mi = m[:, i]
            if not mi.any():
                continue
            cs = np.cumsum(mi)
            taken = cs - (cs - mi)[first]  # disruptions this pod's node has taken so far, itself included
            violating |= mi & (taken > pdb.disruptions_allowed)
        if violating.any():
            again = np.lexsort((np.arange(n), ~violating, slot))
            rows, violating = rows[again], violating[again]
    # put back in order: one pod per node per step, each kept while the pod still fits
    check_rows = list(p.check.rows)
    need = cols.requests[check_rows][:, rows]
    g_of_pos = np.searchsorted(slot[bounds], slots)
    avail = np.empty((len(check_rows), len(bounds)), np.int64)
    avail[:, g_of_pos] = p.free_all[:, slots] - np.array(p.check.requests, np.int64)[:, None]
    dev = p.device
    if dev is not None:  # each device's free thousandths per node, and what each pod holds of them
        dev_avail = np.empty((len(bounds), dev.free_all.shape[1]), np.int64)
        dev_avail[g_of_pos] = dev.free_all[slots]
        dev_need = np.zeros((n, dev.free_all.shape[1]), np.int64)
        _add_devices(dev_need, list(range(n)), [cols.usage[r] for r in rows.tolist()])
    victim = np.zeros(n, bool)
    for k in range(int(lengths.max()) if n else 0):
        live = np.flatnonzero(lengths > k)
        at = bounds[live] + k
        nd = need[:, at]
        keep = (nd <= avail[:, live]).all(axis=0)
        if dev is not None:
            after = dev_avail[live] - dev_need[at]
            keep &= dev.request.fits_free(after)
            dev_avail[live[keep]] = after[keep]
        avail[:, live] -= nd * keep
        victim[at] = ~keep
    vrows, vgroup, vviol = rows[victim], group[victim], violating[victim]
    count = np.bincount(vgroup, minlength=len(bounds))
    begin = np.cumsum(count) - count
    prio = cols.priority[vrows]
    start = cols.start_s[vrows]
    has = count > 0
    at = begin[has]
    first_priority = np.zeros(len(bounds), np.int64)
    priority_sum = np.zeros(len(bounds), np.int64)
    violations = np.zeros(len(bounds), np.int64)
    earliest = np.full(len(bounds), math.inf)
    if len(vrows):
        first_priority[has] = prio[at]
        priority_sum[has] = np.add.reduceat(prio + PRIORITY_OFFSET, at)
        violations[has] = np.add.reduceat(vviol.astype(np.int64), at)
        top = np.zeros(len(bounds), np.int64)
        top[has] = np.maximum.reduceat(prio, at)
        earliest[has] = np.minimum.reduceat(np.where(prio == top[vgroup], start, math.inf), at)
    return Reprieved(count[g_of_pos], violations[g_of_pos], first_priority[g_of_pos], priority_sum[g_of_pos],
                     earliest[g_of_pos], vrows, begin[g_of_pos])
