"""PodColumns: the pods counted in a NodeTable as rows of numpy arrays, for preemption.

DefaultPreemption's victim search (`shardsched.plugins.defaultpreemption`) asks two questions of
every node at once, which the table's per-node dicts of pods answer only one pod at a time:

- how much the pods of priority lower than p request on each node: `requested_below`, from one
  int64 matrix of shape (n_resources, node capacity) per priority value (a cluster has few);
- which pods those are, with what each requests, its priority, ``status.startTime`` and its place
  in its node's pod order: `rows_below`, over arrays with one entry per counted pod.

The columns are not kept up to date pod by pod (that would cost every assume in the scheduling
loop): `sync` refreshes the nodes whose pods changed since the last sync, from the table's change
log (`NodeTable.changed_since`), and rebuilds everything when the log was trimmed past it.
`NodeTable.pod_columns` syncs before it returns them. Readers must not modify the arrays.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shardsched.cache.node_table import NodeTable, PodUsage


class PodColumns:
    """The counted pods of ``table`` as rows (module docstring).

    Attributes (arrays over rows [0, ``rows``); a free row has ``slot`` -1):
        slot: int32, the node slot the pod is counted on.
        priority: int64, the pod's priority.
        start_s: float64, ``status.startTime`` in Unix seconds, +inf when unset (MoreImportantPod
            counts such a pod as started now, after every pod that has a start time).
        order: int64, the pod's place in its node's dict of pods (`NodeTable.pods`), from 0: the
            order the search breaks MoreImportantPod ties in, as the per-node search does.
        requests: int64, shape (n_resources, row capacity), canonical units, rows as the table's.
        usage: the `PodUsage` of each row (None for a free row).
    """

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self._position: int | None = None
        #: moves whenever the rows are laid out anew (`sync` rebuilding everything): a reader that
        #: keeps row numbers of unchanged nodes across syncs checks it
        self.generation = -1
        self._reset(0)

    def _reset(self, pods: int) -> None:
        cap = max(64, 2 * pods)
        self.generation += 1
        self.rows = 0
        self.slot = np.full(cap, -1, np.int32)
        self.priority = np.zeros(cap, np.int64)
        self.start_s = np.zeros(cap, np.float64)
        self.order = np.zeros(cap, np.int64)
        self.requests = np.zeros((len(self.table.resources), cap), np.int64)
        self.usage: list[PodUsage | None] = [None] * cap
        self._free: list[int] = []
        self._slot_rows: dict[int, list[int]] = {}
        #: priority -> requests per node slot, int64 (n_resources, table capacity)
        self._by_priority: dict[int, np.ndarray] = {}

    def _grow_rows(self, need: int) -> None:
        cap = len(self.slot)
        if need <= cap:
            return
        cap = max(need, 2 * cap)
        self.slot = np.concatenate([self.slot, np.full(cap - len(self.slot), -1, np.int32)])
        for name in ("priority", "start_s", "order"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        req = np.zeros((self.requests.shape[0], cap), np.int64)
        req[:, : self.requests.shape[1]] = self.requests
        self.requests = req
        self.usage.extend([None] * (cap - len(self.usage)))

    def sync(self) -> None:
        """Bring the columns up to date with the table (module docstring)."""
        t = self.table
        dirty = None if self._position is None else t.changed_since(self._position)
        if dirty is None or self.requests.shape[0] != len(t.resources):
            self._reset(len(t.pod_slot))
            dirty = np.arange(t.n)
        for p, m in self._by_priority.items():
            if m.shape[1] != t.capacity:
                out = np.zeros((m.shape[0], t.capacity), np.int64)
                out[:, : m.shape[1]] = m
                self._by_priority[p] = out
        if len(dirty):
            self._refresh(dirty.tolist())
        self._position = t.log_position()

    def _refresh(self, slots: list[int]) -> None:
        """Forget the rows of ``slots`` and count their pods again, in each node's order."""
        t = self.table
        old = [r for s in slots for r in self._slot_rows.pop(s, ())]
        if old:
            self.slot[old] = -1
            self.requests[:, old] = 0
            for r in old:
                self.usage[r] = None
            self._free.extend(old)
        for m in self._by_priority.values():
            m[:, slots] = 0
        usages: list[PodUsage] = []
        item_slot, item_order = [], []
        for s in slots:
            if s < t.n and t.valid[s]:
                for k, u in enumerate(t.pods[s].values()):
                    usages.append(u)
                    item_slot.append(s)
                    item_order.append(k)
        if not usages:
            return
        free = self._free
        take = min(len(free), len(usages))
        rows = free[len(free) - take:]
        del free[len(free) - take:]
        if take < len(usages):
            self._grow_rows(self.rows + len(usages) - take)
            rows += range(self.rows, self.rows + len(usages) - take)
            self.rows += len(usages) - take
        for s, r in zip(item_slot, rows):
            self._slot_rows.setdefault(s, []).append(r)
        ra = np.array(rows, np.int64)
        sa = np.array(item_slot, np.int64)
        prio = np.fromiter((u.priority for u in usages), np.int64, len(usages))
        self.slot[ra] = sa
        self.priority[ra] = prio
        self.start_s[ra] = [math.inf if u.start_time_s is None else u.start_time_s for u in usages]
        self.order[ra] = item_order
        for r, u in zip(rows, usages):
            self.usage[r] = u
        res_index = t.res_index
        ri, ci, vals = [], [], []
        for i, u in enumerate(usages):
            for name, v in u.requests.items():
                ri.append(res_index[name])
                ci.append(i)
                vals.append(v)
        ri_a, ci_a, vals_a = np.array(ri, np.int64), np.array(ci, np.int64), np.array(vals, np.int64)
        self.requests[ri_a, ra[ci_a]] = vals_a
        item_prio = prio[ci_a]
        for p in np.unique(prio).tolist():
            m = self._by_priority.get(p)
            if m is None:
                m = self._by_priority[p] = np.zeros((len(t.resources), t.capacity), np.int64)
            at = item_prio == p
            np.add.at(m, (ri_a[at], sa[ci_a[at]]), vals_a[at])

    # ------------------------------------------------------------------ reads
    def requested_below(self, priority: int, n: int, at: np.ndarray | None = None) -> np.ndarray | None:
        """int64 array of shape (n_resources, n): per node slot [0, n), the requests of the counted
        pods of priority strictly lower than ``priority`` (the ``pods`` row counts them); None when
        no priority lower than ``priority`` was seen. ``at``: only those slots (columns in that
        order). A new array, the caller's to keep."""
        levels = [m for p, m in self._by_priority.items() if p < priority]
        if not levels:
            return None
        out = levels[0][:, :n].copy() if at is None else levels[0][:, at]
        for m in levels[1:]:
            out += m[:, :n] if at is None else m[:, at]
        return out

    def rows_below(self, priority: int, on_slots: np.ndarray) -> np.ndarray:
        """int64 array: the rows of the counted pods of priority strictly lower than ``priority`` on
        the nodes where ``on_slots`` (bool array over node slots [0, n)) is True, in row order."""
        r = self.rows
        slot = self.slot[:r]
        hit = np.flatnonzero((slot >= 0) & (self.priority[:r] < priority))
        return hit[on_slots[slot[hit]]]
