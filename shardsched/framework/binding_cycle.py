"""The binding cycle over a batch: Reserve -> Permit -> PreBind -> Bind -> PostBind, with one
rollback path, as kube-scheduler's ``scheduleOne`` runs it for one pod.

A batch is ``pods`` and ``nodes`` of the same length (pod ``i`` placed on node ``nodes[i]``, already
assumed in the caller's table); each point runs its plugins in profile order over the pods still in
the cycle, one call per plugin for the whole batch, and a pod rejected at a point leaves the cycle
there. Failures are returned as ``{batch index: Failure}``; the pods not in it are bound.

`rollback` is the one way out for a pod that does not bind: every Reserve plugin's Unreserve in
reverse order (whichever plugin rejected the pod, as upstream; Unreserve is idempotent), then the
caller's ``forget`` (kube's ``Cache.ForgetPod``, plus whatever the caller holds for the pod since
before its scheduling cycle: a shard's pod lease). `reserve` rolls back the pods it rejects itself;
`permit_and_bind` only makes requests and leaves the rollback of its failures to `finish`, so a
caller may run it on another thread and apply its outcome on its own (as a shard does).

A pod that a Permit plugin holds (Wait) blocks `permit_and_bind` until every plugin that waited
allows it through the `Handle`, one rejects it, or a timeout passes, as upstream's ``WaitOnPermit``
blocks the pod's binding goroutine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from shardsched.api.objects import PodInfo
from shardsched.framework.cycle_state import CycleState
from shardsched.framework.interface import (BindPlugin, Handle, PermitPlugin, PostBindPlugin, PreBindPlugin,
                                            ReservePlugin, WaitingPod)
from shardsched.framework.status import Code, Status

RESERVE, PERMIT, PRE_BIND, BIND = "Reserve", "Permit", "PreBind", "Bind"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a pod left the binding cycle: the ``point`` (RESERVE, PERMIT, PRE_BIND, BIND) and the
    ``status``, whose ``plugin`` names the plugin that failed it."""

    point: str
    status: Status


Forget = Callable[[CycleState, Sequence[PodInfo]], None]


class BindingCycle:
    """The binding-cycle plugins of one profile, and the caller's ``forget`` (module docstring).

    Args:
        handle: where the pods waiting at Permit are registered.
        clock: seconds, monotonic (Permit timeouts).
    """

    def __init__(self, reserve: Sequence[ReservePlugin], permit: Sequence[PermitPlugin],
                 pre_bind: Sequence[PreBindPlugin], bind: Sequence[BindPlugin], post_bind: Sequence[PostBindPlugin],
                 handle: Handle, forget: Forget, clock: Callable[[], float] = time.monotonic) -> None:
        self.reserve_plugins = list(reserve)
        self.permit_plugins = list(permit)
        self.pre_bind_plugins = list(pre_bind)
        self.bind_plugins = list(bind)
        self.post_bind_plugins = list(post_bind)
        self.handle = handle
        self.forget = forget
        self.clock = clock

    def reserve(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> dict[int, Failure]:
        """Run the Reserve plugins; the pods they reject are rolled back (`rollback`) and returned.
        An exception of a plugin (an infrastructure fault) propagates; the caller rolls the batch
        back."""
        failures: dict[int, Failure] = {}
        live = range(len(pods))
        for p in self.reserve_plugins:
            live = self._run(p.reserve, p.name, RESERVE, state, pods, nodes, live, failures)
        if failures:
            self.rollback(state, [pods[i] for i in failures], [nodes[i] for i in failures])
        return failures

    def permit_and_bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> dict[int, Failure]:
        """Run Permit (waiting for the pods held), PreBind and Bind over reserved pods; return the
        failures, not rolled back yet (`finish`). The first Bind plugin that does not Skip a pod
        decides it; a pod every binder skips fails with an Error, as upstream. An exception of a
        plugin propagates; nothing was rolled back then."""
        failures: dict[int, Failure] = {}
        live = self._permit(state, pods, nodes, failures)
        for p in self.pre_bind_plugins:
            live = self._run(p.pre_bind, p.name, PRE_BIND, state, pods, nodes, live, failures)
        for p in self.bind_plugins:
            if not live:
                break
            statuses = p.bind(state, *self._select(pods, nodes, live))
            skipped = []
            for i, st in zip(live, statuses):
                if st.code == Code.SKIP:
                    skipped.append(i)
                elif not st.is_success():
                    failures[i] = Failure(BIND, _by(st, p.name))
            live = skipped
        for i in live:
            failures[i] = Failure(BIND, Status.error("no bind plugin handled the pod"))
        return failures

    def finish(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str],
               failures: dict[int, Failure]) -> None:
        """After `permit_and_bind`: roll back the failed pods, then run PostBind over the bound."""
        if failures:
            self.rollback(state, [pods[i] for i in failures], [nodes[i] for i in failures])
        if not self.post_bind_plugins or len(failures) == len(pods):
            return
        bound = [i for i in range(len(pods)) if i not in failures]
        pods_b, nodes_b = self._select(pods, nodes, bound)
        for p in self.post_bind_plugins:
            p.post_bind(state, pods_b, nodes_b)

    def rollback(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> None:
        """The one rollback path: every Reserve plugin's Unreserve in reverse order, then
        ``forget``. Safe for pods any step of which never happened."""
        if not pods:
            return
        for p in reversed(self.reserve_plugins):
            p.unreserve(state, pods, nodes)
        self.forget(state, pods)

    # ------------------------------------------------------------------ helpers
    def _permit(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str],
                failures: dict[int, Failure]) -> Sequence[int]:
        """Permit: the pods allowed, in batch order; the rejected into ``failures``; the held wait."""
        live: Sequence[int] = range(len(pods))
        waits: dict[int, dict[str, float]] = {}
        for p in self.permit_plugins:
            if not live:
                break
            answers = p.permit(state, *self._select(pods, nodes, live))
            kept = []
            for i, (st, timeout_s) in zip(live, answers):
                if st.is_success():
                    kept.append(i)
                elif st.code == Code.WAIT:
                    kept.append(i)
                    waits.setdefault(i, {})[p.name] = timeout_s
                else:
                    failures[i] = Failure(PERMIT, _by(st, p.name))
            live = kept if len(kept) < len(live) else live
        if not waits:
            return live
        now = self.clock()
        held = {i: WaitingPod(pods[i], nodes[i], waits[i], now) for i in live if i in waits}
        for wp in held.values():
            self.handle.add_waiting_pod(wp)
        try:
            for i, wp in held.items():
                st = wp.wait(self.clock)
                if not st.is_success():
                    failures[i] = Failure(PERMIT, st)
        finally:
            for wp in held.values():
                self.handle.remove_waiting_pod(wp.pod.uid)
        return [i for i in live if i not in failures]

    @staticmethod
    def _select(pods: Sequence[PodInfo], nodes: Sequence[str], live: Sequence[int]):
        if isinstance(live, range) and len(live) == len(pods):
            return pods, nodes
        return [pods[i] for i in live], [nodes[i] for i in live]

    def _run(self, call, name: str, point: str, state: CycleState, pods, nodes, live: Sequence[int],
             failures: dict[int, Failure]) -> Sequence[int]:
        """One plugin's call over the live pods; returns those it passed."""
        if not live:
            return live
        statuses = call(state, *self._select(pods, nodes, live))
        kept = []
        for i, st in zip(live, statuses):
            if st.is_success():
                kept.append(i)
            else:
                failures[i] = Failure(point, _by(st, name))
        return kept if len(kept) < len(live) else live


def _by(st: Status, plugin: str) -> Status:
    """``st`` with the plugin that produced it (the framework records it, as upstream)."""
    return st if st.plugin == plugin else Status(st.code, st.reasons, plugin)
