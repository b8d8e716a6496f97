"""SchedulingQueue: kube's PriorityQueue semantics (activeQ / backoffQ / unschedulable pods), batch pops,
max attempts, all on a FakeClock (no sleeps)."""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsched.api.objects import PodInfo
from shardsched.plugins.queuesort.plugin import PrioritySort
from shardsched.queue import (
    ACTIVE_Q,
    ASSIGNED_POD_DELETE,
    BACKOFF_COMPLETE,
    BACKOFF_Q,
    NODE_ADD,
    NODE_UPDATE,
    POD_ADD,
    SCHEDULE_ATTEMPT_FAILURE,
    UNSCHEDULABLE_Q,
    UNSCHEDULABLE_TIMEOUT,
    FakeClock,
    QueuedPodInfo,
    SchedulingQueue,
)

_uids = itertools.count()


def make_pod(name: str, priority: int = 0, *, namespace: str = "default", uid: str | None = None,
             node_selector: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> PodInfo:
    spec: dict = {"containers": [{"name": "c"}], "priority": priority}
    if node_selector:
        spec["nodeSelector"] = node_selector
    meta = {"name": name, "namespace": namespace, "uid": uid or f"uid-{next(_uids)}", "labels": labels or {},
            "annotations": annotations or {}}
    return PodInfo.from_object({"metadata": meta, "spec": spec})


def make_queue(**kwargs) -> tuple[SchedulingQueue, FakeClock]:
    clock = FakeClock(1000.0)
    return SchedulingQueue(clock, **{"sort_key": PrioritySort().sort_key, **kwargs}), clock


def where(q: SchedulingQueue, key: str) -> str | None:
    """Sub-queue holding ``key``, "in-flight", or None."""
    for name in (ACTIVE_Q, BACKOFF_Q, UNSCHEDULABLE_Q):
        if any(p.key == key for p in q.pods(name)):
            return name
    return "in-flight" if key in q.in_flight else None


def fail(q: SchedulingQueue, key: str, backoff: bool = False) -> QueuedPodInfo:
    """Pop the pod ``key`` (it must be at the head) and report a failed attempt."""
    (qpi,) = q.pop_batch(1)
    assert qpi.key == key
    qpi.last_failure_reason = "0/3 nodes are available"
    assert q.add_unschedulable_if_not_present(qpi, backoff=backoff)
    return qpi


# ------------------------------------------------------------------------------------------ ordering

@pytest.mark.parametrize(
    "adds, expected",
    [
        ([("a", 0, 0), ("b", 10, 0), ("c", 5, 0)], ["b", "c", "a"]),
        ([("a", 0, 0), ("b", 0, 1), ("c", 0, 1)], ["a", "b", "c"]),
        ([(f"p{i}", 7, 0) for i in range(50)], [f"p{i}" for i in range(50)]),
        ([("low", -5, 0), ("a", 3, 0), ("b", 3, 0), ("hi", 100, 2), ("c", 3, 0)], ["hi", "a", "b", "c", "low"]),
        ([("z", 1, 0), ("y", 1, 0), ("x", 1, 0)], ["z", "y", "x"]),
    ],
    ids=["priority-first", "then-earlier-timestamp", "ties-keep-insertion-order", "mixed", "names-do-not-matter"],
)
def test_pop_order_is_queue_sort(adds, expected):
    q, clock = make_queue()
    for name, prio, advance_s in adds:
        clock.advance(advance_s)
        q.add(make_pod(name, prio))
    popped = []
    while batch := q.pop_batch(2):
        popped += [p.pod_info.name for p in batch]
    assert popped == expected


def test_activeq_orders_by_timestamp_not_by_entry_time():
    # x fails at t=1 (timestamp refreshed), y is added at t=5; both reach activeQ on an event at t=20:
    # x entered activeQ after y, but its timestamp is earlier, so it pops first (as upstream).
    q, clock = make_queue()
    q.add(make_pod("x"))
    clock.advance(1)
    fail(q, "default/x")
    clock.advance(4)
    q.add(make_pod("y"))
    clock.advance(15)
    assert q.move_all_to_active_or_backoff_queue(NODE_ADD) == 1
    assert [p.pod_info.name for p in q.pop_batch(10)] == ["x", "y"]


def test_custom_queue_sort_key():
    # A profile's QueueSort plugin decides the order: here plain FIFO, priority ignored.
    q, clock = make_queue(sort_key=lambda pod, timestamp, seq: (timestamp, seq))
    for name, prio in (("a", 0), ("b", 100), ("c", 50)):
        q.add(make_pod(name, prio))
        clock.advance(1)
    assert [p.pod_info.name for p in q.pop_batch(3)] == ["a", "b", "c"]


def test_pop_batch_increments_attempts_and_cycles():
    q, _ = make_queue()
    for i in range(5):
        q.add(make_pod(f"p{i}"))
    batch = q.pop_batch(3)
    assert [p.attempts for p in batch] == [1, 1, 1]
    assert [p.scheduling_cycle for p in batch] == [1, 2, 3]
    assert q.scheduling_cycle == 3
    assert q.in_flight == {"default/p0", "default/p1", "default/p2"}
    assert q.pop_batch(0) == []
    assert len(q.pop_batch(100)) == 2
    assert q.pop_batch(100) == []


def test_add_sets_timestamps_and_known_key_updates_in_place():
    q, clock = make_queue()
    pod = make_pod("a", 1, uid="u1")
    q.add(pod)
    clock.advance(3)
    q.add(make_pod("a", 1, uid="u1", labels={"x": "y"}))
    assert len(q) == 1
    (qpi,) = q.pop_batch(5)
    assert qpi.timestamp == qpi.initial_attempt_timestamp == 1000.0
    assert qpi.pod_info.labels == {"x": "y"}


# ------------------------------------------------------------------------------------------ backoff

@pytest.mark.parametrize(
    "attempts, expected_s",
    [(0, 0), (1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (6, 10), (60, 10)],
    ids=["no-attempt", "1", "2", "3", "4", "5-capped", "6-capped", "60-capped"],
)
def test_backoff_duration(attempts, expected_s):
    q, _ = make_queue()
    assert q.backoff_duration_s(attempts) == expected_s


def test_backoff_sequence_1_2_4_8_10_10():
    q, clock = make_queue(max_attempts=None)
    q.add(make_pod("a"))
    waits = []
    for _ in range(6):
        fail(q, "default/a", backoff=True)
        wait = q.next_ready_in_s()
        waits.append(wait)
        clock.advance(wait - 0.01)
        assert q.pop_batch(1) == [], "popped before its backoff was over"
        clock.advance(0.01)
    assert waits == pytest.approx([1, 2, 4, 8, 10, 10])
    assert q.pop_batch(1)[0].attempts == 7


def test_flush_backoff_completed():
    q, clock = make_queue()
    for name in ("a", "b"):
        q.add(make_pod(name))
    for qpi in q.pop_batch(2):
        q.requeue_backoff(qpi)
    assert q.pending_counts() == {"active": 0, "backoff": 2, "unschedulable": 0, "gated": 0}
    assert q.flush_backoff_completed() == 0
    clock.advance(1)
    assert q.flush_backoff_completed() == 2
    assert q.pending_counts()["active"] == 2
    assert q.incoming_counts()[(ACTIVE_Q, BACKOFF_COMPLETE)] == 2


# ------------------------------------------------------------------------------------------ unschedulable

@pytest.mark.parametrize("event", [NODE_ADD, NODE_UPDATE, ASSIGNED_POD_DELETE], ids=str)
@pytest.mark.parametrize(
    "wait_s, expected", [(0.5, BACKOFF_Q), (1.0, ACTIVE_Q), (30, ACTIVE_Q)],
    ids=["still-backing-off", "backoff-just-over", "long-after"],
)
def test_event_moves_unschedulable_pods(event, wait_s, expected):
    q, clock = make_queue()
    q.add(make_pod("a"))
    fail(q, "default/a")
    assert where(q, "default/a") == UNSCHEDULABLE_Q
    clock.advance(wait_s)
    assert q.move_all_to_active_or_backoff_queue(event) == 1
    assert where(q, "default/a") == expected
    assert q.incoming_counts()[(expected, event)] == 1


@pytest.mark.parametrize(
    "wait_s, expected", [(299, UNSCHEDULABLE_Q), (300, UNSCHEDULABLE_Q), (300.5, "in-flight")],
    ids=["before", "exactly-max-stays", "after-max"],
)
def test_unschedulable_leftover_flushed_after_max_duration(wait_s, expected):
    q, clock = make_queue()
    q.add(make_pod("a"))
    fail(q, "default/a")
    assert q.next_ready_in_s() == 300
    clock.advance(wait_s)
    q.pop_batch(10)  # flushes leftovers first
    assert where(q, "default/a") == expected


def test_unschedulable_flush_moves_only_old_pods():
    q, clock = make_queue()
    q.add(make_pod("old"))
    q.add(make_pod("new"))
    fail(q, "default/old")
    clock.advance(200)
    fail(q, "default/new")
    clock.advance(101)
    assert q.flush_unschedulable_left_over() == 1
    assert where(q, "default/old") == ACTIVE_Q
    assert where(q, "default/new") == UNSCHEDULABLE_Q
    assert q.incoming_counts()[(ACTIVE_Q, UNSCHEDULABLE_TIMEOUT)] == 1
    assert q.next_ready_in_s() == 0.0


# ------------------------------------------------------------------------------------------ failures

@pytest.mark.parametrize(
    "steps, backoff, expected",
    [
        (["pop", "fail"], False, UNSCHEDULABLE_Q),
        (["pop", "fail"], True, BACKOFF_Q),
        (["pop", "event", "fail"], False, BACKOFF_Q),
        (["event", "pop", "fail"], False, UNSCHEDULABLE_Q),
        (["pop", "update-selector", "fail"], False, BACKOFF_Q),
        (["pop", "update-annotations", "fail"], False, UNSCHEDULABLE_Q),
    ],
    ids=["unschedulable", "error-backs-off", "move-request-in-flight", "move-request-before-pop",
         "helpful-update-in-flight", "irrelevant-update-in-flight"],
)
def test_failed_pod_destination(steps, backoff, expected):
    """Upstream AddUnschedulableIfNotPresent: moveRequestCycle >= the pod's cycle sends it to backoffQ."""
    q, _ = make_queue()
    q.add(make_pod("a", uid="u"))
    qpi = None
    for step in steps:
        if step == "pop":
            (qpi,) = q.pop_batch(1)
        elif step == "event":
            q.move_all_to_active_or_backoff_queue(NODE_ADD)
        elif step == "update-selector":
            q.update(make_pod("a", uid="u", node_selector={"zone": "b"}))
        elif step == "update-annotations":
            q.update(make_pod("a", uid="u", annotations={"team": "x"}))
        else:
            assert q.add_unschedulable_if_not_present(qpi, backoff=backoff)
    assert where(q, "default/a") == expected
    assert q.in_flight == frozenset()
    assert q.incoming_counts()[(expected, SCHEDULE_ATTEMPT_FAILURE)] == 1


def test_failure_report_is_noop_when_present():
    q, _ = make_queue()
    q.add(make_pod("a"))
    (qpi,) = q.pop_batch(1)
    assert q.add_unschedulable_if_not_present(qpi)
    assert not q.add_unschedulable_if_not_present(qpi)
    assert not q.requeue_backoff(qpi)
    assert len(q) == 1


def test_failure_timestamp_refreshed():
    q, clock = make_queue()
    q.add(make_pod("a"))
    clock.advance(7)
    qpi = fail(q, "default/a", backoff=True)
    assert qpi.timestamp == 1007.0
    assert qpi.initial_attempt_timestamp == 1000.0


def test_requeue_backoff_accepts_pod_from_another_queue():
    q1, _ = make_queue()
    q2, clock2 = make_queue()
    q1.add(make_pod("a"))
    (qpi,) = q1.pop_batch(1)
    q1.done(qpi.key)
    assert q2.requeue_backoff(qpi)
    assert where(q2, "default/a") == BACKOFF_Q
    clock2.advance(1)
    (again,) = q2.pop_batch(1)
    assert again is qpi and again.attempts == 2


# ------------------------------------------------------------------------------------------ max attempts

@pytest.mark.parametrize("backoff", [False, True], ids=["unschedulable", "errors"])
def test_give_up_hook_called_once_and_pod_kept(backoff):
    reported = []
    q, clock = make_queue(max_attempts=3, on_give_up=reported.append)
    q.add(make_pod("a"))
    for attempt in range(1, 6):
        qpi = fail(q, "default/a", backoff=backoff)
        assert qpi.attempts == attempt
        assert len(reported) == (1 if attempt >= 3 else 0)
        if attempt >= 3:
            assert where(q, "default/a") == UNSCHEDULABLE_Q  # kept, not dropped
        clock.advance(20)
        q.move_all_to_active_or_backoff_queue(NODE_UPDATE)
    assert reported[0].key == "default/a" and reported[0].gave_up
    assert reported[0].last_failure_reason == "0/3 nodes are available"


def test_give_up_hook_error_is_logged_not_raised(caplog):
    def boom(_):
        raise RuntimeError("metrics down")

    q, _ = make_queue(max_attempts=1, on_give_up=boom)
    q.add(make_pod("a"))
    fail(q, "default/a")
    assert where(q, "default/a") == UNSCHEDULABLE_Q
    assert "on_give_up hook failed" in caplog.text


# ------------------------------------------------------------------------------------------ delete / update

@pytest.mark.parametrize("place", [ACTIVE_Q, BACKOFF_Q, UNSCHEDULABLE_Q], ids=str)
def test_delete_from_each_sub_queue(place):
    q, clock = make_queue()
    q.add(make_pod("a"))
    q.add(make_pod("b"))
    if place != ACTIVE_Q:
        (qpi,) = q.pop_batch(1)
        q.add_unschedulable_if_not_present(qpi, backoff=place == BACKOFF_Q)
    assert where(q, "default/a") == place
    assert q.delete("default/a")
    assert not q.delete("default/a")
    assert "default/a" not in q
    clock.advance(400)
    q.move_all_to_active_or_backoff_queue(NODE_ADD)
    assert [p.key for p in q.pop_batch(10)] == ["default/b"]


def test_delete_in_flight_ignores_later_failure():
    q, _ = make_queue()
    q.add(make_pod("a"))
    (qpi,) = q.pop_batch(1)
    assert q.delete("default/a")
    assert q.in_flight == frozenset()
    assert not q.add_unschedulable_if_not_present(qpi)
    assert len(q) == 0


def test_recreated_pod_replaces_old_one():
    q, _ = make_queue()
    q.add(make_pod("a", uid="old"))
    (old,) = q.pop_batch(1)
    q.add(make_pod("a", uid="new"))  # the old pod was deleted and recreated while in flight
    assert not q.add_unschedulable_if_not_present(old)
    (new,) = q.pop_batch(1)
    assert new.pod_info.uid == "new" and new.attempts == 1


@pytest.mark.parametrize(
    "change, expected",
    [({"node_selector": {"zone": "a"}}, ACTIVE_Q), ({"priority": 9}, ACTIVE_Q), ({"labels": {"x": "1"}}, ACTIVE_Q),
     ({"annotations": {"x": "1"}}, UNSCHEDULABLE_Q)],
    ids=["selector-may-help", "priority-may-help", "labels-may-help", "annotations-do-not"],
)
def test_update_of_unschedulable_pod(change, expected):
    q, clock = make_queue()
    q.add(make_pod("a", uid="u"))
    fail(q, "default/a")
    clock.advance(5)
    q.update(make_pod("a", **{"priority": 0, "uid": "u", **change}))
    assert where(q, "default/a") == expected
    assert next(q.pods()).pod_info.uid == "u"


def test_update_reorders_activeq_on_priority_change():
    q, _ = make_queue()
    for name in ("a", "b", "c"):
        q.add(make_pod(name, 1, uid=name))
    q.update(make_pod("c", 5, uid="c"))
    q.update(make_pod("a", 0, uid="a"))
    assert [p.pod_info.name for p in q.pop_batch(3)] == ["c", "b", "a"]


def test_update_of_unknown_pod_adds_it():
    q, _ = make_queue()
    q.update(make_pod("a"))
    assert q.pending_counts()["active"] == 1


def test_update_in_flight_updates_in_place():
    q, _ = make_queue()
    q.add(make_pod("a", uid="u"))
    (qpi,) = q.pop_batch(1)
    q.update(make_pod("a", uid="u", labels={"v": "2"}))
    assert len(q) == 0
    assert qpi.pod_info.labels == {"v": "2"}


# ------------------------------------------------------------------------------------------ inspection

def test_pending_counts_len_contains_done_drain():
    q, _ = make_queue()
    for i in range(6):
        q.add(make_pod(f"p{i}", priority=i))
    batch = q.pop_batch(3)  # p5, p4, p3
    q.add_unschedulable_if_not_present(batch[0])
    q.requeue_backoff(batch[1])
    q.done(batch[2].key)
    q.done(batch[2].key)  # idempotent
    assert q.pending_counts() == {"active": 3, "backoff": 1, "unschedulable": 1, "gated": 0}
    assert len(q) == 5
    assert q.contains("default/p0") and "default/p5" in q and "default/p3" not in q
    assert q.incoming_counts()[(ACTIVE_Q, POD_ADD)] == 6
    assert [p.pod_info.name for p in q.pods()] == ["p2", "p1", "p0", "p4", "p5"]
    drained = q.drain()
    assert [p.pod_info.name for p in drained] == ["p2", "p1", "p0", "p4", "p5"]
    assert len(q) == 0 and q.pop_batch(10) == [] and q.next_ready_in_s() is None


def test_drain_part_of_the_queue_keeps_the_pods_popped_next():
    """What a shard hands back when shards are added: the last pods in ``pods()`` order."""
    q, _ = make_queue()
    for i in range(6):
        q.add(make_pod(f"p{i}", priority=i))
    batch = q.pop_batch(2)  # p5, p4
    q.add_unschedulable_if_not_present(batch[0])
    q.requeue_backoff(batch[1])

    drained = q.drain(max_n=3)

    assert [p.pod_info.name for p in drained] == ["p0", "p4", "p5"]
    assert q.pending_counts() == {"active": 3, "backoff": 0, "unschedulable": 0, "gated": 0}
    assert q.drain(max_n=0) == [] and len(q) == 3
    assert [p.pod_info.name for p in q.pop_batch(10)] == ["p3", "p2", "p1"]


def test_next_ready_in_s():
    q, clock = make_queue()
    assert q.next_ready_in_s() is None
    q.add(make_pod("a"))
    assert q.next_ready_in_s() == 0.0
    fail(q, "default/a", backoff=True)
    clock.advance(0.25)
    assert q.next_ready_in_s() == pytest.approx(0.75)
    q.delete("default/a")
    assert q.next_ready_in_s() is None


@pytest.mark.parametrize(
    "kwargs",
    [{"pod_initial_backoff_s": 0}, {"pod_max_backoff_s": 0.5}, {"pod_max_in_unschedulable_s": 0}, {"max_attempts": 0}],
    ids=["initial-backoff", "max-below-initial", "max-in-unschedulable", "max-attempts"],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        SchedulingQueue(FakeClock(), sort_key=PrioritySort().sort_key, **kwargs)


def test_fake_clock_never_goes_back():
    with pytest.raises(ValueError):
        FakeClock().advance(-1)


def test_large_queue_batches_stay_sorted():
    q, clock = make_queue()
    pods = [make_pod(f"p{i}", priority=(i * 7919) % 13) for i in range(20_000)]
    for i, pod in enumerate(pods):
        if i % 1000 == 0:
            clock.advance(1)
        q.add(pod)
    for pod in pods[::2]:
        q.delete(pod.key)
    popped = []
    while batch := q.pop_batch(1000):
        popped += batch
    assert len(popped) == 10_000
    keys = [(-p.pod_info.priority, p.timestamp) for p in popped]
    assert keys == sorted(keys)


# ------------------------------------------------------------------------------------------ property

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 3)),
        st.tuples(st.just("advance"), st.sampled_from([0.0, 0.5, 1.0, 3.0, 12.0, 400.0])),
        st.tuples(st.just("pop"), st.integers(1, 6)),
        st.tuples(st.just("fail"), st.booleans()),
        st.tuples(st.just("done"), st.just(0)),
        st.tuples(st.just("event"), st.just(0)),
        st.tuples(st.just("delete"), st.integers(0, 50)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_property_pop_order_and_no_pod_lost(ops):
    q, clock = make_queue(max_attempts=3)
    live: dict[str, None] = {}  # keys the queue must hold (queued or in flight), insertion-ordered
    flying: list[QueuedPodInfo] = []
    n = 0
    for op, arg in ops:
        if op == "add":
            pod = make_pod(f"p{n}", arg)
            n += 1
            q.add(pod)
            live[pod.key] = None
        elif op == "advance":
            clock.advance(arg)
        elif op == "pop":
            batch = q.pop_batch(arg)
            order = [(-p.pod_info.priority, p.timestamp) for p in batch]
            assert order == sorted(order), "batch not in QueueSort order"
            flying += batch
        elif op == "fail" and flying:
            q.add_unschedulable_if_not_present(flying.pop(0), backoff=arg)
        elif op == "done" and flying:
            qpi = flying.pop(0)
            q.done(qpi.key)
            del live[qpi.key]
        elif op == "event":
            q.move_all_to_active_or_backoff_queue(ASSIGNED_POD_DELETE)
        elif op == "delete" and live:
            key = list(live)[arg % len(live)]
            assert q.delete(key)
            del live[key]
            flying = [p for p in flying if p.key != key]
        queued = [p.key for p in q.pods()]
        assert len(queued) == len(set(queued)) == len(q)
        assert set(queued).isdisjoint(q.in_flight)
        assert set(queued) | q.in_flight == set(live)
    # Without new arrivals, draining everything gives one globally sorted sequence.
    for qpi in flying:
        q.add_unschedulable_if_not_present(qpi)
    clock.advance(1000)
    popped = q.pop_batch(10_000)
    order = [(-p.pod_info.priority, p.timestamp) for p in popped]
    assert order == sorted(order)
    assert {p.key for p in popped} == set(live)


def test_concurrent_add_and_pop_lose_nothing():
    q, _ = make_queue()
    pods = [make_pod(f"p{i}", i % 5) for i in range(3000)]
    popped: list[QueuedPodInfo] = []

    def producer():
        for pod in pods:
            q.add(pod)

    def consumer():
        while len(popped) < len(pods):
            for qpi in q.pop_batch(64):
                q.done(qpi.key)
                popped.append(qpi)

    threads = [threading.Thread(target=producer, daemon=True), threading.Thread(target=consumer, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(p.key for p in popped) == sorted(p.key for p in pods)
    assert len(q) == 0 and q.in_flight == frozenset()


# ----------------------------------------------------------------------------- waiting instead of polling


def _waiting(q: SchedulingQueue, timeout_s: float = 600.0) -> tuple[threading.Thread, list[bool]]:
    """A thread blocked in ``q.wait_for_pods(timeout_s)``; its answer lands in the list."""
    answers: list[bool] = []
    t = threading.Thread(target=lambda: answers.append(q.wait_for_pods(timeout_s)), daemon=True)
    t.start()
    return t, answers


def test_wait_for_pods_ends_when_another_thread_adds_a_pod_or_wakes_it():
    q, _ = make_queue()
    t, answers = _waiting(q)
    q.add(make_pod("a"))
    t.join(60)
    assert answers == [True] and [p.key for p in q.pop_batch(10)] == ["default/a"]
    t, answers = _waiting(q)
    q.wake()  # nothing queued: the waiter returns, saying there is nothing to pop
    t.join(60)
    assert answers == [False]
    q.wake()  # with nobody waiting, the next wait returns at once, once
    assert q.wait_for_pods(600.0) is False


def test_wait_for_pods_ends_at_the_end_of_a_backoff_and_of_the_unschedulable_timeout():
    """The deadlines of flushBackoffQCompleted and flushUnschedulablePodsLeftover end a wait, and the
    pop that follows moves the pods (the timers of upstream's queue, run by the pop)."""
    q, clock = make_queue(pod_initial_backoff_s=1.0, pod_max_in_unschedulable_s=60.0)
    q.add(make_pod("b"))
    q.add(make_pod("u"))
    fail(q, "default/b", backoff=True)
    fail(q, "default/u")
    assert (where(q, "default/b"), where(q, "default/u")) == (BACKOFF_Q, UNSCHEDULABLE_Q)
    assert q.wait_for_pods(0.0) is False  # neither deadline has come
    clock.advance(1.0)
    assert q.wait_for_pods(600.0) is True
    assert [p.key for p in q.pop_batch(10)] == ["default/b"]
    clock.advance(60.0)
    assert q.wait_for_pods(600.0) is True
    assert [p.key for p in q.pop_batch(10)] == ["default/u"]


def test_a_pod_requeued_into_backoff_from_another_thread_does_not_end_a_wait_before_its_backoff_is_over():
    q, clock = make_queue(pod_initial_backoff_s=1.0)
    q.add(make_pod("r"))
    (qpi,) = q.pop_batch(1)
    clock.advance(5.0)  # the pod's backoff (from its new timestamp) is what decides
    t, answers = _waiting(q)
    q.requeue_backoff(qpi)  # into backoffQ: the wait sees the new deadline, not yet due
    assert t.is_alive()
    clock.advance(1.0)
    q.add(make_pod("other"))  # any change makes the waiter look again
    t.join(60)
    assert answers == [True] and {p.key for p in q.pop_batch(10)} == {"default/r", "default/other"}
