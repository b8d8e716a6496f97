"""The scheduling cycle's decision: Filter -> Score -> select -> assume, vectorized over nodes.

This is kube-scheduler's ``schedulePod`` (findNodesThatFitPod, prioritizeNodes, selectHost) over a
NodeTable, with one addition: results are cached per pod *signature* (identical scheduling-relevant
spec) and, when nodes change, only the changed nodes are recomputed. Within a batch each placed pod
is assumed in the table at once, so later pods of the batch see it and never collide with it.

Selection follows upstream ``selectHost``: the highest total weighted score wins; ties are broken
uniformly at random (here with a seedable numpy Generator).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from shardsched.api.disruption import PodDisruptionBudget
from shardsched.api.objects import POD_GROUP_LABEL, PodInfo
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.framework.cycle_state import FEASIBLE_NODES_KEY, CycleState
from shardsched.framework.diagnosis import Diagnosis, fit_error_message  # noqa: F401  (fit_error_message: re-exported)
from shardsched.framework.interface import FilterPlugin, Handle, PostFilterResult, ScorePlugin
from shardsched.framework.runtime import Framework, Registry
from shardsched.framework.status import Code, Status

if TYPE_CHECKING:
    from shardsched.config import SchedulerConfiguration

NO_NODES_MESSAGE = "no nodes available to schedule pods"
#: kube's minFeasibleNodesToFind / minFeasibleNodePercentageToFind
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODE_PERCENTAGE_TO_FIND = 5
#: up to this many changed nodes, the cached path recomputes them with the scalar plugin paths
_SCALAR_UPDATE_MAX = 8

#: kube's ``extension_point`` label values of the points `GenericScheduler.duration_s` counts
FILTER, SCORE = "Filter", "Score"


@dataclass(slots=True)
class ScheduleResult:
    """Outcome of one scheduling decision.

    Attributes:
        node: chosen node name, or None when the pod is unschedulable.
        status: Success, or Unschedulable with the kube-style ``0/N nodes are available: ...`` message.
        devices: the GPU devices taken on ``node`` (indices in the node's order; () for none),
            as the profile's GPUDevice plugin chose them, else the table's best fit.
    """

    pod: PodInfo
    node: str | None
    status: Status
    devices: tuple[int, ...] = ()

    @property
    def scheduled(self) -> bool:
        return self.node is not None


def num_feasible_nodes_to_find(percentage: int | None, num_all_nodes: int) -> int:
    """kube's ``numFeasibleNodesToFind``: how many feasible nodes to look for before scoring.

    None = all nodes (shardsched's default: vectorized scoring is cheaper than the search cut-off);
    0 = adaptive, ``max(5, 50 - n/125)`` percent; at least 100 nodes; all nodes when n < 100.
    """
    if percentage is None or num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND or percentage >= 100:
        return num_all_nodes
    pct = percentage
    if pct <= 0:
        pct = max(MIN_FEASIBLE_NODE_PERCENTAGE_TO_FIND, 50 - num_all_nodes // 125)
    num = num_all_nodes * pct // 100
    return max(num, MIN_FEASIBLE_NODES_TO_FIND)


@dataclass(slots=True)
class _Entry:
    """Cached Filter/Score results of one pod signature over all table slots."""

    static_generation: int
    log_position: int
    n: int
    state: CycleState
    filters_static: list[FilterPlugin]
    filters_dynamic: list[FilterPlugin]
    scores_dynamic: list[tuple[ScorePlugin, int]]
    #: scores normalized over the feasible nodes at selection: static plugins' and topology ones'
    scores_static: list[tuple[ScorePlugin, int, np.ndarray]]
    static_ok: np.ndarray
    dyn_ok: np.ndarray
    dyn_score: np.ndarray
    final: np.ndarray = field(default=None)  # type: ignore[assignment]
    static_varies: bool = False
    rejected: Status | None = None
    #: NodeTable.affinity_generation when computed (existing pods' terms decide InterPodAffinity)
    affinity_generation: int = 0
    #: a topology plugin took part: the entry holds only while no node changed at all
    topology: bool = False
    #: NodeTable.volume_generation when computed, for a pod with volumes (None: the pod has none)
    volume_generation: int | None = None


class GenericScheduler:
    """Decides placements for one profile over one NodeTable.

    Args:
        framework: the profile's plugins.
        table: the node view; this class assumes placed pods into it (``assume=True``).
        seed: seed of the tie-breaking RNG (None = random).
        cache_size: max number of signatures kept (least recently inserted dropped first).

    ``duration_s``: seconds `schedule` spent at each extension point since this scheduler was built,
    by kube's ``extension_point`` label value: ``Filter`` (PreFilter and Filter) and ``Score``
    (PreScore, Score, NormalizeScore and the selection of a node); the runtime turns them into
    ``scheduler_framework_extension_point_duration_seconds``.
    """

    def __init__(self, framework: Framework, table: NodeTable, seed: int | None = None,
                 cache_size: int = 4096) -> None:
        self.framework = framework
        self.table = table
        self.rng = np.random.default_rng(seed)
        self.cache: dict[str, _Entry] = {}
        self.cache_size = cache_size
        self.next_start_node_index = 0
        self._sampled = framework.percentage_of_nodes_to_score is not None
        self.duration_s: dict[str, float] = {FILTER: 0.0, SCORE: 0.0}
        #: PodDisruptionBudgets, read by PostFilter (DefaultPreemption); the owner keeps them current
        self.pdbs: list[PodDisruptionBudget] = []

    # ------------------------------------------------------------------ public
    def schedule(self, pod: PodInfo, assume: bool = True) -> ScheduleResult:
        """Filter, score and select a node for ``pod``; assume it there when ``assume``. A pod with
        a ``nominated_node_name`` goes there if it fits, else nowhere (`_schedule_nominated`).

        Returns a ScheduleResult; never raises for an unschedulable pod (that is a Status).
        """
        table = self.table
        if table.num_nodes == 0:
            return ScheduleResult(pod, None, Status.unschedulable(NO_NODES_MESSAGE))
        t0, counted = time.perf_counter(), self.duration_s[FILTER] + self.duration_s[SCORE]
        rejected = self._state_pre_filter(pod)
        if rejected is not None:
            self.duration_s[FILTER] += time.perf_counter() - t0
            return ScheduleResult(pod, None, self._prefilter_status(rejected))
        if pod.nominated_node_name:
            result = self._schedule_nominated(pod)
        elif self._sampled and num_feasible_nodes_to_find(self.framework.percentage_of_nodes_to_score,
                                                        table.num_nodes) < table.num_nodes:
            result = self._schedule_sampled(pod)
        else:
            entry = self._entry(pod)
            result = self._select(pod, entry)
        # what `_compute` and `_update` did not count (cache look-ups, selection) counts as Score
        duration = self.duration_s
        duration[SCORE] += time.perf_counter() - t0 - (duration[FILTER] + duration[SCORE] - counted)
        if result.node is not None:
            result.devices = self.device_choice(pod, result.node)
            if assume:
                table.add_pod(PodUsage.of(pod, result.devices), result.node)
        return result

    def schedule_many(self, pods: Sequence[PodInfo]) -> list[ScheduleResult]:
        """Schedule ``pods`` one after the other, each assumed on its node before the next one is
        decided: what `schedule` (``assume=True``) on each in turn does, the same Filter and Score
        results and a uniform choice among the best nodes at each step, with consecutive pods of
        one signature placed many at a time (`_schedule_run`).

        The caller passes pods that the profile's state PreFilter plugins treat as one whatever of
        them is assumed (a gang's members for Coscheduling, whose answer its own members'
        assumes do not change): they run once for the first pod of each run of one signature.

        Returns one ScheduleResult per pod, in order; never raises for an unschedulable pod.
        """
        out: list[ScheduleResult] = []
        i = 0
        run_key = lambda p: (self._cache_key(p), p.nominated_node_name)  # noqa: E731
        while i < len(pods):
            key = run_key(pods[i])
            j = i + 1
            while j < len(pods) and run_key(pods[j]) == key:
                j += 1
            out += self._schedule_run(pods[i:j])
            i = j
        return out

    def _schedule_run(self, pods: Sequence[PodInfo]) -> list[ScheduleResult]:
        """`schedule_many` for pods of one signature. Where the pod's entry has no score that the
        whole feasible set normalizes (static or topology scores that vary), no nomination,
        device, volume or sampling: the best score M is found once for many pods; the next pods
        take distinct nodes of score M in random order (as many as there are, or pods), are
        assumed, and those nodes are scored again. One-by-one selection picks the same way as long
        as each such node falls below M once taken; the first that does not ends the step there
        (the pods after it are forgotten and decided in the next step). Once no node fits, the
        rest get the first one's diagnosis (nothing changes in between)."""
        table, first = self.table, pods[0]
        if (len(pods) == 1 or table.num_nodes == 0 or first.nominated_node_name or not first.volumes.empty
                or PodUsage.of(first).gpu is not None
                or (self._sampled and num_feasible_nodes_to_find(self.framework.percentage_of_nodes_to_score,
                                                                 table.num_nodes) < table.num_nodes)):
            return [self.schedule(p) for p in pods]
        t0, counted = time.perf_counter(), self.duration_s[FILTER] + self.duration_s[SCORE]
        rejected = self._state_pre_filter(first)
        if rejected is not None:
            self.duration_s[FILTER] += time.perf_counter() - t0
            status = self._prefilter_status(rejected)
            return [ScheduleResult(p, None, status) for p in pods]
        entry = self._entry(first)
        if entry.rejected is None and (entry.static_varies or entry.topology):
            return [self.schedule(p) for p in pods]
        out: list[ScheduleResult] = []
        i = 0
        while i < len(pods):
            if entry.rejected is not None:
                status = self._prefilter_status(entry.rejected)
                out += [ScheduleResult(p, None, status) for p in pods[i:]]
                break
            final = entry.final
            best = int(final.max())
            if best < 0:
                status = self._diagnose(first, entry.state, entry)
                out += [ScheduleResult(p, None, status) for p in pods[i:]]
                break
            top = np.flatnonzero(final == best)
            m = min(len(pods) - i, len(top))
            chosen = top if len(top) == 1 else self.rng.choice(top, m, replace=False)
            names = [table.names[slot] for slot in chosen.tolist()]
            for pod, name in zip(pods[i:i + m], names):
                table.add_pod(PodUsage.of(pod, ()), name)
            entry = self._entry(first)
            again = np.flatnonzero(entry.final[chosen] >= best)
            if len(again) and again[0] + 1 < m:
                m = int(again[0]) + 1
                for pod in pods[i + m:i + len(names)]:
                    table.remove_pod(pod.uid)
                entry = self._entry(first)
            out += [ScheduleResult(pod, name, Status.success()) for pod, name in zip(pods[i:i + m], names)]
            i += m
        duration = self.duration_s
        duration[SCORE] += time.perf_counter() - t0 - (duration[FILTER] + duration[SCORE] - counted)
        return out

    def device_choice(self, pod: PodInfo, node: str) -> tuple[int, ...]:
        """The GPU devices ``pod`` takes on ``node``: the profile's device chooser's (a score
        plugin with ``choose_devices``, GPUDevice), else the table's best fit; () for no GPU or
        when no devices of the node fit it now. On
        its nominated node, the devices its nomination holds (``nominated_devices``) when they fit."""
        table = self.table
        slot = table.index[node]
        usage = PodUsage.of(pod, ())
        if usage.gpu is None:
            return ()
        if pod.nominated_devices and node == pod.nominated_node_name and table.devices.fits(
                slot, pod.nominated_devices, usage.gpu):
            return pod.nominated_devices
        for ws in self.framework.score_plugins:
            choose = getattr(ws.plugin, "choose_devices", None)
            if choose is not None:
                devices = choose(pod, table, slot)
                if devices:
                    return devices
        return table.devices.pick(slot, usage.gpu)

    def feasible_mask(self, pod: PodInfo) -> tuple[np.ndarray, np.ndarray]:
        """(static_ok, feasible): bool arrays over table slots [0, n). ``static_ok``: the nodes that
        pass the filters that depend only on node attributes; ``feasible``: the nodes where the pod
        fits now. Cached per signature like `schedule` (the coordinator routes pods with it).
        Read-only: do not modify the arrays."""
        entry = self._entry(pod)
        if entry.rejected is not None:
            empty = np.zeros(self.table.n, bool)
            return empty, empty
        return entry.static_ok, entry.final >= 0

    def pre_filter(self, pod: PodInfo) -> tuple[CycleState, list[FilterPlugin], Status]:
        """The profile's PreFilter plugins for ``pod`` over the table as it is now, uncached
        (`PostFilterHandle.pre_filter`): the cycle state, the Filter plugins not skipped (profile
        order), and Success or the first rejection with its code and the plugin's name."""
        table, state = self.table, CycleState()
        rejected = self._state_pre_filter(pod)
        if rejected is not None:
            return rejected
        active: list[FilterPlugin] = []
        for f in self.framework.pre_filter_plugins:
            st = f.pre_filter(state, pod, table)
            if st.is_skip():
                continue
            if not st.is_success():
                return state, active, Status(st.code, st.reasons, f.name)
            if isinstance(f, FilterPlugin):
                active.append(f)
        return state, active, Status.success()

    def filter_node(self, pod: PodInfo, slot: int) -> Status:
        """PreFilter then Filter of the profile for ``pod`` on one node (slot), over the table as it
        is now, uncached (`PostFilterHandle.filter_node`): Success, or the first rejection (the
        PreFilter's, or the first failing Filter's reasons with its code and name)."""
        table = self.table
        state, active, st = self.pre_filter(pod)
        if not st.is_success():
            return st
        one = np.array([slot])
        for f in active:
            if not f.filter_slot(state, pod, table, slot):
                code = (Code.UNSCHEDULABLE_AND_UNRESOLVABLE if f.unresolvable_mask(state, pod, table, one)[0]
                        else Code.UNSCHEDULABLE)
                return Status(code, tuple(f.failure_reasons(state, pod, table, one)), f.name)
        return Status.success()

    def node_local(self, pod: PodInfo) -> bool:
        """Whether the pod's Filter results on a node change only with that node's pods and
        attributes (`PostFilterHandle.node_local`): no PreFilter rejected it and no topology plugin
        took part in its cached decision (pod affinity and anti-affinity, the pod's or existing
        pods', and topology spread read other nodes); the cache keeps such results per changed
        node on the same condition."""
        entry = self._entry(pod)
        return entry.rejected is None and not entry.topology

    def post_filter(self, pod: PodInfo, status: Status) -> PostFilterResult | None:
        """Run the profile's PostFilter plugins for a pod that fits no node (``status`` is the failed
        attempt's, with its `Diagnosis`), as upstream ``RunPostFilterPlugins``: the first that
        nominates a node wins; otherwise the last one's result. None when the profile has no
        PostFilter plugin or the status has no diagnosis. The result's message is also set as the
        diagnosis' ``post_filter_msg``."""
        diagnosis = status.diagnosis
        if diagnosis is None or not self.framework.post_filter_plugins:
            return None
        result = None
        for plugin in self.framework.post_filter_plugins:
            result = plugin.post_filter(CycleState(), pod, diagnosis, self)
            if result.status.is_success():
                break
        assert result is not None
        diagnosis.post_filter_msg = result.status.message
        return result

    def forget(self, pod: PodInfo) -> None:
        """Undo an assume (kube's ForgetPod); safe to call when the pod was never assumed."""
        self.table.remove_pod(pod.uid)

    def invalidate(self) -> None:
        """Drop every cached signature (e.g. after the table was rebuilt)."""
        self.cache.clear()

    def _state_pre_filter(self, pod: PodInfo) -> Status | None:
        """The first rejection of the profile's uncached PreFilter plugins
        (``Framework.state_pre_filter_plugins``), with the plugin's name; None when all pass."""
        for f in self.framework.state_pre_filter_plugins:
            st = f.pre_filter(CycleState(), pod, self.table)
            if st.is_rejected() or st.code == Code.ERROR:
                return Status(st.code, st.reasons, f.name)
        return None

    # ------------------------------------------------------------------ cache
    def _cache_key(self, pod: PodInfo) -> str:
        """The pod's spec signature (no plugin reads the nominated node), with its PodGroup label
        when a pod or a spread selector on this table reads that label
        (``PodInfo.compute_signature`` leaves it out)."""
        group = pod.labels.get(POD_GROUP_LABEL)
        if group is None or not self.table.reads_pod_label(POD_GROUP_LABEL):
            return pod.spec_signature
        return f"{pod.spec_signature}/{group}"

    def _entry(self, pod: PodInfo) -> _Entry:
        table = self.table
        key = self._cache_key(pod)
        entry = self.cache.get(key)
        if (entry is not None and entry.static_generation == table.static_generation and entry.n == table.n
                and entry.affinity_generation == table.affinity_generation
                and (entry.volume_generation is None or entry.volume_generation == table.volume_generation)
                and not (entry.topology and entry.log_position != table.log_position())):
            if entry.rejected is None:
                dirty = table.changed_since(entry.log_position)
                if dirty is None:
                    entry = None
                elif len(dirty):
                    self._update(pod, entry, dirty)
            if entry is not None:
                entry.log_position = table.log_position()
                return entry
        entry = self._compute(pod)
        if len(self.cache) >= self.cache_size:
            self.cache.pop(next(iter(self.cache)))
        self.cache[key] = entry
        return entry

    def _compute(self, pod: PodInfo) -> _Entry:
        t0 = time.perf_counter()
        table, fw = self.table, self.framework
        n = table.n
        state = CycleState()
        everything = slice(0, n)
        fstatic, fdyn, rejected, topology = [], [], None, False
        affinity_generation = table.affinity_generation
        for f in fw.pre_filter_plugins:
            st = f.pre_filter(state, pod, table)
            if st.is_skip():
                continue
            if not st.is_success():
                rejected = Status(st.code, st.reasons, f.name)
                break
            topology = topology or f.topology
            if isinstance(f, FilterPlugin):
                (fstatic if f.static else fdyn).append(f)
        static_ok = table.valid[:n].copy()
        dyn_ok = np.ones(n, bool)
        if rejected is None:
            for f in fstatic:
                static_ok &= f.filter(state, pod, table, everything)
            for f in fdyn:
                dyn_ok &= f.filter(state, pod, table, everything)
        t1 = time.perf_counter()
        # Scores only where the pod fits now: a node that starts to fit later changes first, and
        # a changed node is recomputed in full (filters and scores) by `_update`.
        feasible = static_ok & dyn_ok
        state.write(FEASIBLE_NODES_KEY, feasible)
        count = int(feasible.sum())
        where: slice | np.ndarray = everything if count * 2 > n else np.flatnonzero(feasible)
        sdyn, sstatic = [], []
        dyn_score = np.zeros(n, np.int64)
        static_varies = False
        for ws in fw.score_plugins if rejected is None else ():
            st = ws.plugin.pre_score(state, pod, table)
            if st.is_skip():
                continue
            if ws.plugin.topology:
                # over the nodes feasible now, normalized in `_select`; the entry is recomputed
                # when any node changes
                topology = True
                sstatic.append((ws.plugin, ws.weight, ws.plugin.score(state, pod, table, everything)))
                static_varies = True
            elif ws.plugin.static:
                # a static score that is the same on every node that can ever pass the static
                # filters (until the next static change) cannot change the choice: left out
                raw = ws.plugin.score(state, pod, table, everything)
                vals = raw[static_ok]
                if vals.size and vals.min() != vals.max():
                    sstatic.append((ws.plugin, ws.weight, raw))
                    static_varies = True
            else:
                sdyn.append((ws.plugin, ws.weight))
                if count:
                    dyn_score[where] += ws.weight * ws.plugin.score(state, pod, table, where)
        entry = _Entry(table.static_generation, table.log_position(), n, state, fstatic, fdyn, sdyn, sstatic,
                       static_ok, dyn_ok, dyn_score, static_varies=static_varies, rejected=rejected,
                       affinity_generation=affinity_generation, topology=topology,
                       volume_generation=None if pod.volumes.empty else table.volume_generation)
        entry.final = np.where(feasible, dyn_score, -1)
        self.duration_s[FILTER] += t1 - t0
        self.duration_s[SCORE] += time.perf_counter() - t1
        return entry

    def _update(self, pod: PodInfo, entry: _Entry, dirty: np.ndarray) -> None:
        """Recompute dynamic filters and scores on the slots that changed (one by one with the
        plugins' scalar paths when few changed, vectorized otherwise)."""
        table, state = self.table, entry.state
        t0 = time.perf_counter()
        if len(dirty) <= _SCALAR_UPDATE_MAX:
            slots = dirty.tolist()
            oks = [bool(entry.static_ok[slot]) and all(f.filter_slot(state, pod, table, slot)
                                                       for f in entry.filters_dynamic) for slot in slots]
            t1 = time.perf_counter()
            for slot, ok in zip(slots, oks):
                score = sum(w * p.score_slot(state, pod, table, slot) for p, w in entry.scores_dynamic)
                entry.dyn_ok[slot] = ok
                entry.dyn_score[slot] = score
                entry.final[slot] = score if ok else -1
        else:
            ok = entry.static_ok[dirty]
            for f in entry.filters_dynamic:
                ok &= f.filter(state, pod, table, dirty)
            t1 = time.perf_counter()
            score = np.zeros(len(dirty), np.int64)
            for plugin, weight in entry.scores_dynamic:
                score += weight * plugin.score(state, pod, table, dirty)
            entry.dyn_ok[dirty] = ok
            entry.dyn_score[dirty] = score
            entry.final[dirty] = np.where(ok, score, -1)
        self.duration_s[FILTER] += t1 - t0
        self.duration_s[SCORE] += time.perf_counter() - t1

    # ------------------------------------------------------------------ select
    def _pick(self, candidates: np.ndarray) -> int:
        if len(candidates) == 1:
            return int(candidates[0])
        return int(candidates[self.rng.integers(len(candidates))])

    def _select(self, pod: PodInfo, entry: _Entry) -> ScheduleResult:
        if entry.rejected is not None:
            return ScheduleResult(pod, None, self._prefilter_status(entry.rejected))
        final = entry.final
        if entry.static_varies:
            feasible = final >= 0
            final = final.copy()
            for plugin, weight, raw in entry.scores_static:
                final[feasible] += weight * plugin.normalize_score(entry.state, pod, raw[feasible])
        best = int(final.max())
        if best < 0:
            return ScheduleResult(pod, None, self._diagnose(pod, entry.state, entry))
        slot = self._pick(np.flatnonzero(final == best))
        return ScheduleResult(pod, self.table.names[slot], Status.success())

    def _schedule_nominated(self, pod: PodInfo) -> ScheduleResult:
        """The pod on its nominated node or not at all: the node the coordinator chose over the whole
        cluster (``PodInfo.nominated_node_name``), if it passes this table's filters."""
        name = pod.nominated_node_name
        slot = self.table.index.get(name)
        if slot is None:
            return ScheduleResult(pod, None, Status.unschedulable(f"nominated node {name} is not among these nodes"))
        entry = self._entry(pod)
        if entry.rejected is not None:
            return ScheduleResult(pod, None, self._prefilter_status(entry.rejected))
        if entry.final[slot] < 0:
            return ScheduleResult(pod, None, Status.unschedulable(f"nominated node {name} does not fit the pod"))
        return ScheduleResult(pod, name, Status.success())

    def _schedule_sampled(self, pod: PodInfo) -> ScheduleResult:
        """kube's path with ``percentageOfNodesToScore``: filter nodes in round-robin order from
        ``next_start_node_index`` until enough feasible ones are found, then score only those."""
        table, fw = self.table, self.framework
        entry = self._compute(pod)
        if entry.rejected is not None:
            return ScheduleResult(pod, None, self._prefilter_status(entry.rejected))
        n = table.n
        feasible = entry.static_ok & entry.dyn_ok
        want = num_feasible_nodes_to_find(fw.percentage_of_nodes_to_score, table.num_nodes)
        order = (self.next_start_node_index + np.arange(n)) % n
        in_order = feasible[order]
        cum = np.cumsum(in_order)
        if cum[-1] == 0:
            return ScheduleResult(pod, None, self._diagnose(pod, entry.state, entry))
        if cum[-1] > want:
            processed = int(np.searchsorted(cum, want)) + 1
        else:
            processed = n
        chosen = order[:processed][in_order[:processed]]
        self.next_start_node_index = (self.next_start_node_index + processed) % n
        total = entry.dyn_score[chosen].copy()
        for plugin, weight, raw in entry.scores_static:
            total += weight * plugin.normalize_score(entry.state, pod, raw[chosen])
        best = int(total.max())
        slot = int(chosen[self._pick(np.flatnonzero(total == best))])
        return ScheduleResult(pod, table.names[slot], Status.success())

    # ------------------------------------------------------------------ failure path
    def _prefilter_status(self, st: Status) -> Status:
        """A PreFilter rejection as kube's FitError words it: ``0/N nodes are available: <the
        PreFilter's message>.``, without a per-node count (every node has the same status); its
        `Diagnosis` counts the message once per node."""
        n = self.table.num_nodes
        reasons = {r: n for r in st.reasons} or {f"{st.plugin} rejected the pod": n}
        diagnosis = Diagnosis(n, reasons, unschedulable_plugins=(st.plugin,) if st.plugin else (),
                              pre_filter_msg=", ".join(reasons),
                              pre_filter_unresolvable=st.code != Code.UNSCHEDULABLE)
        return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (diagnosis.message(),), st.plugin, diagnosis)

    def _diagnose(self, pod: PodInfo, state: CycleState, entry: _Entry) -> Status:
        """Which plugin rejected each node, first failing plugin per node in profile order (as kube,
        which stops at a node's first failing Filter), summed into the FitError message.

        Returns an Unschedulable Status with its `Diagnosis` (reasons, the rejected nodes and which
        of them are UnschedulableAndUnresolvable, the rejecting plugins).
        """
        table = self.table
        n = table.n
        everything = slice(0, n)
        remaining = table.valid[:n].copy()
        unresolvable = np.zeros(n, bool)
        active = set(map(id, entry.filters_static + entry.filters_dynamic))
        reasons: dict[str, int] = {}
        plugins: list[str] = []
        for f in self.framework.filter_plugins:
            if id(f) not in active:
                continue
            ok = f.filter(state, pod, table, everything)
            failed = np.flatnonzero(remaining & ~ok)
            if len(failed):
                plugins.append(f.name)
                for reason, count in f.failure_reasons(state, pod, table, failed).items():
                    reasons[reason] = reasons.get(reason, 0) + count
                unresolvable[failed] = f.unresolvable_mask(state, pod, table, failed)
            remaining &= ok
        diagnosis = Diagnosis(table.num_nodes, reasons, table.valid[:n] & ~remaining, unresolvable, tuple(plugins))
        return Status(Code.UNSCHEDULABLE, (diagnosis.message(),), ",".join(plugins), diagnosis)


def build_schedulers(config: SchedulerConfiguration, table: NodeTable, seed: int | None,
                     partial_view: bool = False, handle: Handle | None = None,
                     registry: Registry | None = None) -> dict[str, GenericScheduler]:
    """One GenericScheduler per profile over a shared table, keyed by schedulerName (first = default).

    ``partial_view``: the table holds only part of the cluster (a shard's nodes; `Framework`).
    ``handle``: the frameworks' `Handle` (where binds go), shared by the profiles.
    ``registry``: the plugins the profiles may name (default: the in-tree plugins).

    Raises:
        ConfigError: a profile names a plugin shardsched does not have.
    """
    if registry is None:
        from shardsched.plugins.registry import IN_TREE
        registry = IN_TREE
    if handle is None:
        handle = Handle()
    if handle.table is None:
        handle.table = table
    out = {}
    for i, profile in enumerate(config.profiles):
        fw = Framework(profile, registry, config.percentage_of_nodes_to_score, partial_view, handle)
        out[profile.scheduler_name] = GenericScheduler(fw, table, seed=None if seed is None else seed + i)
    return out
