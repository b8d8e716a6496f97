"""The binding cycle (`shardsched.framework.binding_cycle`): Reserve -> Permit -> PreBind -> Bind ->
PostBind over a batch, its one rollback path, and Permit's waiting pods, with plugins that record
what they were asked, and DefaultBinder binding into a real `SimCluster`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from builders import pod
from shardsched.api.objects import PodInfo
from shardsched.framework.binding_cycle import BIND, PERMIT, PRE_BIND, RESERVE, BindingCycle
from shardsched.framework.cycle_state import BIND_OUTCOME_UNKNOWN_KEY, CycleState
from shardsched.framework.interface import (ALLOW, BindPlugin, Handle, PermitPlugin, PostBindPlugin, PreBindPlugin,
                                            ReservePlugin)
from shardsched.framework.status import Code, Status
from shardsched.plugins.defaultbinder.plugin import RESULTS_KEY, DefaultBinder
from shardsched.sim import SimCluster, uniform_nodes, uniform_pods


@dataclass
class Journal:
    """What the plugins of one test were called with, in order: (plugin, call, pod names)."""

    calls: list[tuple[str, str, list[str]]] = field(default_factory=list)

    def add(self, plugin: str, call: str, pods) -> None:
        self.calls.append((plugin, call, [p.name for p in pods]))


class Holder(ReservePlugin):
    """Holds each pod it reserves; rejects the pods named in ``reject``; Unreserve frees what it holds."""

    def __init__(self, name: str, journal: Journal, reject: frozenset[str] = frozenset()) -> None:
        self.name = name
        self.journal = journal
        self.reject = reject
        self.held: set[str] = set()

    def reserve(self, state, pods, nodes):
        self.journal.add(self.name, "reserve", pods)
        out = []
        for p in pods:
            if p.name in self.reject:
                out.append(Status.unschedulable(f"{self.name} has no room for {p.name}"))
            else:
                self.held.add(p.uid)
                out.append(Status.success())
        return out

    def unreserve(self, state, pods, nodes):
        self.journal.add(self.name, "unreserve", pods)
        self.held.difference_update(p.uid for p in pods)


class Gate(PermitPlugin, PreBindPlugin, PostBindPlugin):
    """Permit: Wait (``wait_s``) for the pods named in ``wait``, reject those in ``reject``; records
    PreBind and PostBind."""

    def __init__(self, journal: Journal, wait: frozenset[str] = frozenset(), reject: frozenset[str] = frozenset(),
                 wait_s: float = 30.0) -> None:
        self.name = "Gate"
        self.journal, self.wait, self.reject, self.wait_s = journal, wait, reject, wait_s

    def permit(self, state, pods, nodes):
        self.journal.add(self.name, "permit", pods)
        return [(Status(Code.WAIT), self.wait_s) if p.name in self.wait
                else (Status.unschedulable("gate closed"), 0.0) if p.name in self.reject else ALLOW for p in pods]

    def pre_bind(self, state, pods, nodes):
        self.journal.add(self.name, "pre_bind", pods)
        return [Status.success()] * len(pods)

    def post_bind(self, state, pods, nodes):
        self.journal.add(self.name, "post_bind", pods)


def pods_of(*names: str) -> list[PodInfo]:
    return [pod(n, cpu="100m").info() for n in names]


def make_cycle(journal: Journal, reserve, permit=(), *, cluster: SimCluster | None = None, handle: Handle | None = None):
    handle = handle or Handle(cluster)
    gates = [p for p in permit if isinstance(p, Gate)]
    return BindingCycle(reserve, permit, gates, [DefaultBinder(handle)], gates, handle,
                        forget=lambda state, pods: journal.add("cache", "forget", pods))


def cluster_with(names: list[str]) -> SimCluster:
    cluster = SimCluster(seed=0)
    cluster.create_nodes(uniform_nodes(2, cpu="4", memory="8Gi"))
    cluster.create_pods(uniform_pods(len(names), cpu="100m", memory="64Mi", scheduler_name="shardsched"))
    return cluster


def cluster_pods(cluster: SimCluster) -> list[PodInfo]:
    return [PodInfo.from_object(p) for p in cluster.list_pods()[0]]


def test_a_reserve_rejection_unreserves_every_plugin_in_reverse_order_then_forgets() -> None:
    journal = Journal()
    first, second = Holder("First", journal), Holder("Second", journal, reject=frozenset({"b"}))
    cycle = make_cycle(journal, [first, second])
    pods = pods_of("a", "b", "c")
    failures = cycle.reserve(CycleState(), pods, ["n1", "n1", "n2"])
    assert list(failures) == [1]
    assert failures[1].point == RESERVE and failures[1].status.plugin == "Second"
    assert failures[1].status.code == Code.UNSCHEDULABLE
    assert journal.calls == [
        ("First", "reserve", ["a", "b", "c"]),
        ("Second", "reserve", ["a", "b", "c"]),
        ("Second", "unreserve", ["b"]),  # the plugin that rejected it too: Unreserve is idempotent
        ("First", "unreserve", ["b"]),
        ("cache", "forget", ["b"]),
    ]
    assert first.held == {pods[0].uid, pods[2].uid} and second.held == {pods[0].uid, pods[2].uid}


def test_a_pod_rejected_by_the_first_reserve_plugin_never_reaches_the_second() -> None:
    journal = Journal()
    cycle = make_cycle(journal, [Holder("First", journal, reject=frozenset({"a"})), Holder("Second", journal)])
    failures = cycle.reserve(CycleState(), pods_of("a", "b"), ["n1", "n1"])
    assert failures[0].status.plugin == "First"
    assert journal.calls[:2] == [("First", "reserve", ["a", "b"]), ("Second", "reserve", ["b"])]


def test_rollback_is_safe_for_pods_reserve_never_ran_for() -> None:
    journal = Journal()
    holder = Holder("First", journal)
    cycle = make_cycle(journal, [holder])
    pods = pods_of("a")
    cycle.rollback(CycleState(), pods, ["n1"])
    cycle.rollback(CycleState(), pods, ["n1"])
    assert journal.calls == [("First", "unreserve", ["a"]), ("cache", "forget", ["a"])] * 2
    assert holder.held == set()


def test_bind_through_the_default_binder_and_post_bind_only_the_bound() -> None:
    cluster = cluster_with(["a", "b"])
    pods = cluster_pods(cluster)
    journal = Journal()
    gate = Gate(journal, reject=frozenset({pods[1].name}))
    cycle = make_cycle(journal, [Holder("First", journal)], [gate], cluster=cluster)
    state = CycleState()
    nodes = ["node-00000", "node-00001"]
    assert cycle.reserve(state, pods, nodes) == {}
    failures = cycle.permit_and_bind(state, pods, nodes)
    assert list(failures) == [1] and failures[1].point == PERMIT and failures[1].status.plugin == "Gate"
    cycle.finish(state, pods, nodes, failures)
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.list_pods()[0]}
    assert bound == {pods[0].name: "node-00000", pods[1].name: None}
    assert journal.calls[-4:] == [
        ("Gate", "pre_bind", [pods[0].name]),
        ("First", "unreserve", [pods[1].name]),
        ("cache", "forget", [pods[1].name]),
        ("Gate", "post_bind", [pods[0].name]),
    ]


def test_default_binder_keeps_the_code_of_a_failed_bind() -> None:
    cluster = cluster_with(["a", "b"])
    pods = cluster_pods(cluster)
    cluster.bind_many([(pods[0].namespace, pods[0].name, "node-00001", pods[0].uid)])  # bound by someone else
    journal = Journal()
    cycle = make_cycle(journal, [], cluster=cluster)
    state = CycleState()
    failures = cycle.permit_and_bind(state, pods, ["node-00000", "node-00000"])
    assert list(failures) == [0] and failures[0].point == BIND and failures[0].status.plugin == "DefaultBinder"
    assert state[RESULTS_KEY][pods[0].uid][0] == 409
    assert failures[0].status.message.startswith("409")
    assert state[BIND_OUTCOME_UNKNOWN_KEY] == set()


def test_a_bind_call_without_answer_marks_the_outcome_unknown() -> None:
    class Broken:
        def bind_many(self, bindings):
            raise ConnectionError("connection reset")

    journal = Journal()
    cycle = make_cycle(journal, [], handle=Handle(Broken()))
    state = CycleState()
    pods = pods_of("a", "b")
    failures = cycle.permit_and_bind(state, pods, ["n1", "n2"])
    assert sorted(failures) == [0, 1]
    assert state[BIND_OUTCOME_UNKNOWN_KEY] == {pods[0].uid, pods[1].uid}
    assert failures[0].status.message == "ConnectionError: connection reset"


@pytest.mark.parametrize("verdict", ["allow", "reject"])
def test_a_waiting_pod_is_allowed_or_rejected_through_the_handle(verdict: str) -> None:
    cluster = cluster_with(["a", "b"])
    pods = cluster_pods(cluster)
    journal = Journal()
    handle = Handle(cluster)
    cycle = make_cycle(journal, [Holder("First", journal)], [Gate(journal, wait=frozenset({pods[0].name}))],
                       handle=handle)
    state, nodes = CycleState(), ["node-00000", "node-00001"]
    cycle.reserve(state, pods, nodes)
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(cycle.permit_and_bind(state, pods, nodes)))
    runner.start()
    seen: list = []
    while not seen:  # the binding cycle registers the pod, then waits
        handle.iterate_over_waiting_pods(seen.append)
    assert [wp.pod.uid for wp in seen] == [pods[0].uid] and seen[0].get_pending_plugins() == ["Gate"]
    assert handle.get_waiting_pod(pods[1].uid) is None
    if verdict == "allow":
        seen[0].allow("Gate")
    else:
        assert handle.reject_waiting_pod(pods[0].uid, "Gate", "sibling failed")
    runner.join(10)
    assert not runner.is_alive()
    assert handle.get_waiting_pod(pods[0].uid) is None
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.list_pods()[0]}
    if verdict == "allow":
        assert out == {} and bound == {pods[0].name: "node-00000", pods[1].name: "node-00001"}
    else:
        assert list(out) == [0] and out[0].point == PERMIT and out[0].status.message == "sibling failed"
        assert out[0].status.code == Code.UNSCHEDULABLE and bound[pods[0].name] is None


def test_a_waiting_pod_is_rejected_when_its_timeout_passes() -> None:
    journal = Journal()
    cycle = make_cycle(journal, [], [Gate(journal, wait=frozenset({"a"}), wait_s=0.05)], handle=Handle())
    failures = cycle.permit_and_bind(CycleState(), pods_of("a"), ["n1"])
    assert failures[0].point == PERMIT and failures[0].status.plugin == "Gate"
    assert failures[0].status.message == "rejected due to timeout after waiting 0.05s at plugin Gate"
    assert cycle.handle.get_waiting_pod(pods_of("a")[0].uid) is None


def test_a_pod_no_binder_handles_fails_at_bind() -> None:
    class Skipper(BindPlugin):
        name = "Skipper"

        def bind(self, state, pods, nodes):
            return [Status.skip()] * len(pods)

    handle = Handle()
    cycle = BindingCycle([], [], [], [Skipper()], [], handle, forget=lambda state, pods: None)
    failures = cycle.permit_and_bind(CycleState(), pods_of("a"), ["n1"])
    assert failures[0].point == BIND and failures[0].status.code == Code.ERROR


def test_a_pre_bind_failure_stops_the_pod_before_bind() -> None:
    class Refuse(PreBindPlugin):
        name = "Refuse"

        def pre_bind(self, state, pods, nodes):
            return [Status.error("volume not ready")] * len(pods)

    cluster = cluster_with(["a"])
    pods = cluster_pods(cluster)
    handle = Handle(cluster)
    cycle = BindingCycle([], [], [Refuse()], [DefaultBinder(handle)], [], handle, forget=lambda state, pods: None)
    failures = cycle.permit_and_bind(CycleState(), pods, ["node-00000"])
    assert failures[0].point == PRE_BIND and failures[0].status.plugin == "Refuse"
    assert cluster.list_pods()[0][0]["spec"].get("nodeName") is None
