"""The ``kube-like`` baseline: kube-scheduler's loop, emulated honestly, in one process.

What it does, per scheduling cycle (upstream ``scheduleOne``):

1. the informer: watch events of the in-process `SimCluster` (``events_since``) go into the
   scheduler cache (a `NodeTable`) and new pending pods of our profiles into the `SchedulingQueue`;
2. pop **one** pod from activeQ (PrioritySort order);
3. ``schedulePod`` with the profile's **full plugin set** (kube's default profile unless ``--config``)
   and ``percentageOfNodesToScore: 0``, kube's adaptive rule: `GenericScheduler`'s sampled path
   filters in round-robin order from ``nextStartNodeIndex`` until ``numFeasibleNodesToFind``
   feasible nodes are found and scores only those;
4. assume the pod in the cache, then **bind it alone** (``bind_many`` of one item to the
   in-process cluster) and wait for the answer; no batching of any step.

What it does not do, on purpose, so that the ratio to it means something: no per-signature reuse of
Filter/Score results (kube has none): the signature cache is dropped before every cycle, which
matters only below ~100 nodes, where kube filters and scores every node and `GenericScheduler` takes
its cached path; above that the sampled path never reads the cache. The report says which path ran
(``sampled_path``) and how many cache entries were left at the end (``signature_cache_entries``: 0
on the sampled path; at most the last cycle's own entry, never read, on the other).

Where it is kinder than a real kube-scheduler (say so when quoting it): binding is an in-process
call (~tens of µs) instead of an API round trip, there is no client-side rate limit (kube's
``--kube-api-qps``), and Filter/Score are vectorized numpy over all nodes instead of 16 goroutines
over node chunks. It is slower in one way: Python.

`run_in_subprocess` runs it in a fresh process (``spawn``) so that its CPU time and peak RSS are its
own; the pods are created by a feeder thread in that process (the API server's share, as the
simulated cluster actor's CPU counts in the shardsched rows).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import resource
import threading
import time
from typing import Any, Callable

from shardsched.api.objects import NodeInfo, PodInfo
from shardsched.bench.harness import Measurement
from shardsched.cache.node_table import NodeTable, PodUsage
from shardsched.config import SchedulerConfiguration
from shardsched.errors import InvalidObjectError
from shardsched.queue import NODE_ADD, SchedulingQueue
from shardsched.scheduler.algorithm import num_feasible_nodes_to_find
from shardsched.scheduler.algorithm import build_schedulers
from shardsched.sharding.binding_cycle import CREATED_AT_ANNOTATION
from shardsched.sim.cluster import FaultConfig, SimCluster

#: kube's adaptive percentageOfNodesToScore
ADAPTIVE = 0
PROGRESS_EVERY_S = 0.25


def kube_like_config(config: SchedulerConfiguration) -> SchedulerConfiguration:
    """``config`` with ``percentageOfNodesToScore: 0`` (kube's adaptive rule) globally and in every
    profile, whatever the file said."""
    profiles = [dataclasses.replace(p, percentage_of_nodes_to_score=ADAPTIVE) for p in config.profiles]
    return dataclasses.replace(config, profiles=profiles, percentage_of_nodes_to_score=ADAPTIVE)


def run(config: SchedulerConfiguration, nodes: list[dict], pods: list[dict], seed: int = 0, timeout_s: float = 600.0,
        create_chunk: int = 2000, bind_latency_s: float = 0.0,
        on_progress: Callable[[int, int], None] | None = None,
        after_load: Callable[[], None] | None = None, created_at: list[float] | None = None) -> dict[str, Any]:
    """Run the baseline in this process (see module docstring) until every pod is bound or parked
    unschedulable, or ``timeout_s``.

    Args:
        config: the scheduler configuration; forced to the adaptive percentage here.
        nodes, pods: Node and Pod dicts; pods are created in a burst, ``create_chunk`` per call (as
            the embedded run's feeder does), each stamped with its creation time
            (`CREATED_AT_ANNOTATION`, Unix seconds).
        bind_latency_s: the simulated API's answer time per bind call (`FaultConfig`); 0 = none.
        created_at: per pod, when to create it (seconds after the start, non-decreasing; pods due
            within 5 ms of each other are created in one call, as the embedded run's replay does);
            None = the burst.
        on_progress: called with (bound, total) every `PROGRESS_EVERY_S`.
        after_load: called once the nodes are listed, before the burst (the bench's child process
            freezes them out of the collector there, as shardsched's processes do: `shardsched.gctune`).

    Returns:
        a plain dict: ``bound``, ``unschedulable``, ``latencies_s`` (creation -> bound), ``wall_s``
        (burst start to the last bind), ``cpu_s`` (this process over the same span), ``peak_rss_bytes``,
        ``sampled_path``, ``signature_cache_entries``, ``cycles``, ``errors``.
    """
    config = kube_like_config(config)
    cluster = SimCluster(seed=seed, faults=FaultConfig(bind_latency_s=bind_latency_s) if bind_latency_s else None)
    cluster.create_nodes(nodes)
    node_objs, rv = cluster.list_nodes()
    table = NodeTable(len(node_objs))
    table.add_nodes(NodeInfo.from_object(n) for n in node_objs)
    schedulers = build_schedulers(config, table, seed)
    default = next(iter(schedulers.values()))
    if after_load is not None:
        after_load()
    qs = default.framework.queue_sort
    queue = SchedulingQueue(sort_key=qs.sort_key, pod_initial_backoff_s=config.pod_initial_backoff_s,
                            pod_max_backoff_s=config.pod_max_backoff_s,
                            pod_max_in_unschedulable_s=config.pod_max_in_unschedulable_s, max_attempts=None)
    ours = {p.scheduler_name for p in config.profiles}
    errors: list[str] = []

    def create(chunk: list[dict]) -> None:
        now = repr(time.time())
        for p in chunk:
            p.setdefault("metadata", {}).setdefault("annotations", {})[CREATED_AT_ANNOTATION] = now
        cluster.create_pods(chunk)

    def feed() -> None:
        try:
            if created_at is None:
                for i in range(0, len(pods), create_chunk):
                    create(pods[i:i + create_chunk])
                return
            t0, i = time.monotonic(), 0
            while i < len(pods):
                wait_s = t0 + created_at[i] - time.monotonic()
                if wait_s > 0.005:
                    time.sleep(wait_s)
                due = time.monotonic() - t0 + 0.005
                j = i
                while j < len(pods) and created_at[j] <= due:
                    j += 1
                create(pods[i:j])
                i = j
        except Exception as e:  # noqa: BLE001 - reported, the loop ends on its own
            errors.append(f"feeder: {type(e).__name__}: {e}")

    def informer() -> None:
        nonlocal rv
        events, rv = cluster.events_since(rv, ("Node", "Pod"))
        for ev in events:
            obj = ev.object
            if ev.kind == "Node":
                if ev.type == "DELETED":
                    table.remove_node(obj["metadata"]["name"])
                else:
                    table.add_node(NodeInfo.from_object(obj))
                    queue.move_all_to_active_or_backoff_queue(NODE_ADD)
                continue
            uid = obj["metadata"]["uid"]
            if ev.type == "DELETED":
                table.remove_pod(uid)
                queue.delete(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")
                continue
            node = obj["spec"].get("nodeName")
            if node:
                if uid not in table.pod_slot:  # bound by someone else; ours are assumed already
                    table.add_pod(PodUsage.of(PodInfo.from_object(obj)), node)
            elif ev.type == "ADDED" and obj["spec"].get("schedulerName") in ours:
                try:
                    queue.add(PodInfo.from_object(obj))
                except InvalidObjectError as e:
                    errors.append(f"invalid pod {obj['metadata']['name']}: {e}")

    latencies: list[float] = []
    bound = cycles = 0
    total = len(pods)
    cpu0 = _cpu_s()
    t0 = time.monotonic()
    last_bind = t0
    feeder = threading.Thread(target=feed, name="api-clients", daemon=True)
    feeder.start()
    next_report = t0
    while True:
        now = time.monotonic()
        if on_progress is not None and now >= next_report:
            on_progress(bound, total)
            next_report = now + PROGRESS_EVERY_S
        if now - t0 > timeout_s:
            errors.append(f"timed out after {timeout_s:.0f} s with {total - bound} pods not bound")
            break
        fed = not feeder.is_alive()  # before the informer: then it has seen every pod created
        informer()
        batch = queue.pop_batch(1)
        if not batch:
            counts = queue.pending_counts()
            if fed and counts["active"] == 0 and counts["backoff"] == 0:  # the rest is unschedulable
                break
            time.sleep(0.001)
            continue
        cycles += 1
        q = batch[0]
        pod = q.pod_info
        sched = schedulers.get(pod.scheduler_name, default)
        sched.invalidate()  # kube keeps no Filter/Score results between cycles
        result = sched.schedule(pod)
        if result.node is None:
            q.last_failure_reason = result.status.message
            queue.add_unschedulable_if_not_present(q)
            continue
        answer = cluster.bind_many([(pod.namespace, pod.name, result.node, pod.uid)])[0]
        if answer.ok:
            queue.done(q.key)
            bound += 1
            last_bind = time.monotonic()
            created = (pod.obj.get("metadata", {}).get("annotations") or {}).get(CREATED_AT_ANNOTATION)
            if created:
                latencies.append(time.time() - float(created))
        else:
            sched.forget(pod)
            q.last_failure_reason = f"binding failed: {answer.code} {answer.message}"
            queue.requeue_backoff(q)
    cpu_s = _cpu_s() - cpu0
    feeder.join(timeout=5)
    if on_progress is not None:
        on_progress(bound, total)
    inv = cluster.invariants()
    return {
        "bound": bound, "unschedulable": queue.pending_counts()["unschedulable"], "latencies_s": latencies,
        "wall_s": last_bind - t0,
        "cpu_s": cpu_s, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "sampled_path": num_feasible_nodes_to_find(ADAPTIVE, table.num_nodes) < table.num_nodes,
        "nodes_to_find": num_feasible_nodes_to_find(ADAPTIVE, table.num_nodes),
        "signature_cache_entries": sum(len(s.cache) for s in schedulers.values()), "cycles": cycles,
        "invariants_ok": not (inv["overcommitted_nodes"] or inv["admission_rejections"] or inv["double_binds"]),
        "errors": errors,
    }


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child(conn: Any, config: SchedulerConfiguration, nodes: list[dict], pods: list[dict], seed: int,
           timeout_s: float, create_chunk: int, bind_latency_s: float, created_at: list[float] | None) -> None:
    from shardsched import gctune

    gctune.tune()  # the same collector settings as shardsched's processes
    try:
        out = run(config, nodes, pods, seed, timeout_s, create_chunk, bind_latency_s,
                  on_progress=lambda b, t: conn.send(("progress", b, t)), after_load=gctune.freeze_loaded,
                  created_at=created_at)
        conn.send(("result", out))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def run_in_subprocess(config: SchedulerConfiguration, nodes: list[dict], pods: list[dict], seed: int = 0,
                      timeout_s: float = 600.0, create_chunk: int = 2000, bind_latency_s: float = 0.0,
                      on_progress: Callable[[int, int], None] | None = None,
                      on_start: Callable[[int], None] | None = None, name: str = "kube-like",
                      created_at: list[float] | None = None) -> Measurement:
    """`run` in a fresh ``spawn`` process (its CPU and memory are then its own); returns the row.
    ``on_start(pid)`` is called once the process runs (e.g. to attach a profiler).

    The process is ended (terminate, then kill) if it has not finished ``timeout_s`` + 60 s after it
    started, or when this call is interrupted.
    """
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, config, nodes, pods, seed, timeout_s, create_chunk, bind_latency_s,
                                            created_at),
                       name="kube-like", daemon=True)
    proc.start()
    child.close()
    if on_start is not None:
        on_start(proc.pid)
    result: dict[str, Any] | None = None
    error = ""
    deadline = time.monotonic() + timeout_s + 60
    try:
        while time.monotonic() < deadline:
            if not parent.poll(0.25):
                if not proc.is_alive():
                    error = error or f"the kube-like process exited with code {proc.exitcode}"
                    break
                continue
            try:
                msg = parent.recv()
            except EOFError:
                error = error or f"the kube-like process exited with code {proc.exitcode}"
                break
            if msg[0] == "progress" and on_progress is not None:
                on_progress(msg[1], msg[2])
            elif msg[0] == "result":
                result = msg[1]
                break
            elif msg[0] == "error":
                error = msg[1]
                break
        else:
            error = "the kube-like process did not finish in time"
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
        parent.close()
    params = {"nodes": len(nodes), "shards": 0, "batch_size": 1, "percentage_of_nodes_to_score": ADAPTIVE}
    if result is None:
        return Measurement(name, len(pods), 0, params=params, errors=[error])
    wall = result["wall_s"]
    params.update(sampled_path=result["sampled_path"], nodes_to_find=result["nodes_to_find"],
                  signature_cache_entries=result["signature_cache_entries"], cycles=result["cycles"])
    return Measurement(
        name=name, pods=len(pods), bound=result["bound"], latencies_s=result["latencies_s"],
        throughput_pods_per_s=result["bound"] / wall if wall > 0 else 0.0,
        cpu_cores=result["cpu_s"] / wall if wall > 0 else 0.0, peak_rss_bytes=result["peak_rss_bytes"], wall_s=wall,
        cpu_s_by_process={"kube-like": round(result["cpu_s"], 3)}, invariants_ok=result["invariants_ok"],
        params=params, errors=result["errors"],
    )
