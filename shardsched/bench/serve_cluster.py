"""The objects of a ``serve --bench`` run (`BenchObjects`: its pods and nodes, made ready without a
kubelet by `register_node`) and its observer (`observe`, the child process whose watch times the
binds). The measurements are `shardsched.bench.serve.Bench`'s."""

from __future__ import annotations

import gc
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait

from shardsched.cluster import POD, AlreadyExists, Conflict
from shardsched.kube.client import MERGE_PATCH, Api, ClientSpec
from shardsched.kube.informer import Reflector, list_all
from shardsched.kube.watches import BOUND, Store, WatchSpec
from shardsched.sharding.binding_cycle import CREATED_AT_ANNOTATION

log = logging.getLogger(__name__)


#: a schedulerName no scheduler serves: pods of the baseline stay pending until we bind them
UNSERVED = "shardsched-bench-unserved"
#: taint of the nodes the bench creates (NoSchedule; the bench's pods tolerate it), so that no
#: other scheduler puts real pods on nodes that have no kubelet and are deleted at the end
BENCH_TAINT = {"key": "shardsched.io/bench", "value": "true", "effect": "NoSchedule"}
#: label of the nodes the bench creates; the bench's pods then select them (nodeSelector)
BENCH_LABEL = "shardsched.io/bench"
#: label naming the run that made a node (its value is `Bench.run_id`); the run's pods select it, so
#: that nodes left by an interrupted run are neither used nor deleted by the next
BENCH_RUN_LABEL = "shardsched.io/bench-run"
#: ``app`` label of every bench pod (the observer's watch selects it; cleanup after a SIGKILL too)
BENCH_APP = "shardsched-bench"


#: objects per page of the bench's lists
LIST_PAGE = 500
#: pods one node made by ``--bench-nodes`` takes (its allocatable ``pods``)
BENCH_NODE_PODS = 10000


class BenchInterrupted(Exception):
    """The ``stop`` event of `Bench` was set (SIGINT/SIGTERM) while the bench prepared."""


def bench_scheduler_name() -> str:
    """The schedulerName a ``serve --bench`` run serves and gives its pods: unique per run, so that
    the bench never schedules (nor writes Events on) the cluster's own pending pods."""
    return f"shardsched-bench-{uuid.uuid4().hex[:6]}"




def bench_pod(name: str, namespace: str, scheduler_name: str, run_nodes: str | None = None) -> dict:
    """A bench pod; ``run_nodes``: the run id whose nodes alone it may go onto (nodeSelector), or
    None for any node."""
    spec = {"schedulerName": scheduler_name, "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                            "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}
    if run_nodes:  # only onto the nodes this run made, never the cluster's own nor another run's
        spec["nodeSelector"] = {BENCH_LABEL: "true", BENCH_RUN_LABEL: run_nodes}
        spec["tolerations"] = [{"key": BENCH_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": BENCH_APP},
                         "annotations": {CREATED_AT_ANNOTATION: repr(time.time())}},
            "spec": spec}


def register_node(api, node: dict, exist_ok: bool = False) -> None:
    """Create ``node`` through ``api`` (a `shardsched.kube.client.Api` with rights on nodes) and make
    it schedulable the way a kubelet and the node lifecycle controller would: status condition
    ``Ready=True``, and ``spec.taints`` set back to the node's own (dropping the
    ``node.kubernetes.io/not-ready`` taint added at admission).

    ``exist_ok``: a node of that name already there (left by an interrupted run) is made Ready
    the same way instead of failing.

    Raises: `shardsched.cluster.ApiError` from any of the three writes.
    """
    name = node["metadata"]["name"]
    try:
        api.request("POST", "/api/v1/nodes", verb="create", resource="nodes", body=node)
    except (Conflict, AlreadyExists):
        if not exist_ok:
            raise
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "no kubelet: marked Ready by shardsched"}
    api.request("PATCH", f"/api/v1/nodes/{name}/status", verb="patch", resource="nodes/status",
                body={"status": {"conditions": [ready]}}, content_type=MERGE_PATCH)
    patch: dict = {"spec": {"taints": (node.get("spec") or {}).get("taints")}}
    if node["metadata"].get("labels"):  # also on a node left by an interrupted run
        patch["metadata"] = {"labels": node["metadata"]["labels"]}
    api.request("PATCH", f"/api/v1/nodes/{name}", verb="patch", resource="nodes", body=patch,
                content_type=MERGE_PATCH)



def observe(spec: ClientSpec, namespace: str, prefix: str, count: int, conn) -> None:
    """The bench's observer (a child process, talking over the pipe ``conn``): list then watch the
    namespace's bench pods (label ``app=shardsched-bench``: the baseline's and the backlog's, so
    that its watch loads the API server alike in both phases); send ``("ready", None)`` once
    listed; then, once every pod of ``names`` is bound, the deadline of the ``("go", timeout_s)``
    message passes or ``("stop", None)`` arrives, send ``("done", (bound_at, created_at))``: name
    -> bind seen and name -> created (Unix s, from the bench annotation). The pods counted are the
    ``count`` ones named ``prefix`` + 6 digits. The watch then goes on (through the second
    baseline) until the next message, or until the parent is gone."""
    # No cyclic collector here: what the observer holds is decoded JSON, which reference counting
    # frees, and its collections, rescanning every pod event held, took 0.2-1.7 s of the core it
    # shares with the scheduler under test once it held a few hundred thousand objects (0.6 s with
    # `gctune`'s thresholds), stalling the binds being measured.
    gc.disable()
    spec_w = WatchSpec("bench-pods", POD, f"/api/v1/namespaces/{namespace}/pods", "", BOUND,
                       label_selector=f"app={BENCH_APP}")
    api = Api(spec.api_client(pool_size=4), None, (spec.connect_timeout_s, spec.request_timeout_s))
    store = Store([spec_w])
    reflector = Reflector(api, store, spec_w, watch_timeout_s=60)
    try:
        reflector.list()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    reflector.start()
    conn.send(("ready", None))
    ours = {f"{prefix}{i:06d}" for i in range(count)}
    bound_at: dict[str, float] = {}
    created_at: dict[str, float] = {}
    seq = 0
    deadline = None
    try:
        while len(bound_at) < len(ours):
            try:
                if conn.poll():
                    msg, arg = conn.recv()
                    if msg == "stop":
                        return
                    deadline = time.monotonic() + arg
            except (EOFError, OSError):  # the parent is gone
                return
            if deadline is not None and time.monotonic() > deadline:
                break
            events, seq = store.since(seq)
            now = time.time()
            for ev in events:
                meta = ev.object.get("metadata") or {}
                name = meta.get("name")
                if name not in ours:
                    continue
                created = (meta.get("annotations") or {}).get(CREATED_AT_ANNOTATION)
                if created:
                    created_at.setdefault(name, float(created))
                if (ev.object.get("spec") or {}).get("nodeName"):
                    bound_at.setdefault(name, now)
            time.sleep(0.005)
        conn.send(("done", (bound_at, created_at)))
        # keep watching (and loading the API server as before) through the second baseline
        while not conn.poll(0.5):
            pass
    except (EOFError, OSError):  # the parent is gone, or sent "stop"
        pass
    finally:
        reflector.stop()


class BenchObjects:
    """The pods and nodes of one bench run in ``namespace``: created, listed and deleted through a
    client without a rate limit, ``workers`` requests at once; `Bench` measures with them.

    Args:
        spec: connection (its rate limit is not applied here: the bench measures the server).
        scheduler_name: the schedulerName shardsched serves (its first profile).
        namespace: where the bench pods live (must exist).
        workers: concurrent create/delete/bind requests.
        stop: set by serve's SIGINT/SIGTERM handler: requests not yet sent raise `BenchInterrupted`.
    """

    def __init__(self, spec: ClientSpec, scheduler_name: str, namespace: str = "default", workers: int = 32,
                 stop: threading.Event | None = None) -> None:
        self.spec = spec
        self._stop = stop if stop is not None else threading.Event()
        self.scheduler_name = scheduler_name
        self.namespace = namespace
        self.workers = workers
        self.run_id = uuid.uuid4().hex[:6]  # in pod names: a run never collides with another's leftovers
        client = spec.api_client(pool_size=workers + 4)
        self.api = Api(client, None, (spec.connect_timeout_s, spec.request_timeout_s))
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="bench")
        self._run_nodes: str | None = None  # the run id once the bench makes its own nodes
        self._names: list[str] = []  # the backlog's pods
        self._baseline_names: list[str] = []  # the pods of the baseline running
        self._made_nodes: list[str] = []  # the nodes made, as they are made

    @property
    def interrupted(self) -> bool:
        """True once the ``stop`` event is set."""
        return self._stop.is_set()

    def _check(self) -> None:
        if self._stop.is_set():
            raise BenchInterrupted("interrupted")

    def _create(self, pods: list[dict]) -> list[dict]:
        path = f"/api/v1/namespaces/{self.namespace}/pods"

        def one(pod: dict) -> dict:
            self._check()  # after a SIGINT the requests not yet sent are not sent
            return self.api.request("POST", path, verb="create", resource="pods", body=pod)
        return list(self.pool.map(one, pods))

    def _delete(self, names: list[str]) -> None:
        def one(name: str) -> None:
            try:
                self.api.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}", verb="delete",
                                 resource="pods", body={"gracePeriodSeconds": 0})
            except Exception as e:  # noqa: BLE001 - cleanup is best effort
                log.debug("delete %s: %s", name, e)
        list(self.pool.map(one, names))

    def _list(self, path: str, resource: str, **selectors: str) -> list[dict]:
        """Every object of a list (`shardsched.kube.informer.list_all`, pages of `LIST_PAGE`: a
        large cluster's pods are not one response)."""
        query = [(k, v) for k, v in (("labelSelector", selectors.get("label")),
                                     ("fieldSelector", selectors.get("field"))) if v]
        return list_all(self.api, path, resource, query, LIST_PAGE)[0]

    def nodes(self) -> list[str]:
        return [n["metadata"]["name"] for n in self._list("/api/v1/nodes", "nodes")]

    def warn_leftovers(self) -> tuple[int, int]:
        """Log a warning when nodes or pods of an earlier bench run are still there (a run killed
        with SIGKILL cannot clean up): this run neither uses nor deletes them, the warning gives the
        commands that do. Returns (nodes, pods) found; (0, 0) when they cannot be listed."""
        try:
            nodes = self._list("/api/v1/nodes", "nodes", label=BENCH_LABEL)
            pods = self._list(f"/api/v1/namespaces/{self.namespace}/pods", "pods", label=f"app={BENCH_APP}")
        except Exception as e:  # noqa: BLE001 - only a warning
            log.debug("bench leftovers: %s", e)
            return 0, 0
        if nodes or pods:
            # the Events a killed run wrote name its scheduler (its measured pods carry that name)
            names = sorted({(p.get("spec") or {}).get("schedulerName") or "" for p in pods} - {"", UNSERVED})
            events = "".join(f"; kubectl delete events -n {self.namespace} --field-selector reportingComponent={name}"
                             for name in names)
            # without a kubelet a bound pod stays Terminating through its grace period: force it
            log.warning("bench: %d node(s) and %d pod(s) of an earlier bench run are still in the cluster (a run "
                        "stopped by SIGKILL cannot clean up); this run leaves them alone. Delete them with: "
                        "kubectl delete pods -n %s -l app=%s --grace-period=0 --force; kubectl delete nodes -l %s%s",
                        len(nodes), len(pods), self.namespace, BENCH_APP, BENCH_LABEL, events)
        return len(nodes), len(pods)

    def create_nodes(self, count: int) -> list[str]:
        """Create ``count`` nodes with room for many pods (for clusters without kubelets, e.g. a bare
        API server), `workers` at once, a progress line every 1,000; returns their names."""
        self._run_nodes = self.run_id
        names = [f"shardsched-bench-{self.run_id}-node-{i:04d}" for i in range(count)]
        alloc = {"cpu": "1000", "memory": "4000Gi", "pods": str(BENCH_NODE_PODS)}
        self._made_nodes = made = []  # as they are made: an interrupted run deletes those
        lock = threading.Lock()

        def one(name: str) -> None:
            self._check()
            with lock:
                made.append(name)
                if len(made) % 1000 == 0:
                    log.warning("bench: creating nodes, %d of %d", len(made), count)
            register_node(self.api, {"apiVersion": "v1", "kind": "Node",
                                     "metadata": {"name": name, "labels": {BENCH_LABEL: "true",
                                                                           BENCH_RUN_LABEL: self.run_id}},
                                     "spec": {"taints": [dict(BENCH_TAINT)]},
                                     "status": {"capacity": alloc, "allocatable": alloc}})
        futures = [self.pool.submit(one, name) for name in names]  # `workers` at once
        wait(futures)  # all settled before an error is raised: `cleanup` then sees every node made
        for f in futures:
            f.result()
        return names

    def delete_events(self) -> int | None:
        """Delete the Events shardsched wrote for the bench's pods (call once the scheduler has
        stopped and flushed them): one delete-collection of the namespace's Events whose reporting
        controller is the bench's scheduler name (``reportingComponent`` in core/v1), which no
        other writer uses. Returns how many were deleted, or None when the API server refused
        (logged with the kubectl command that does it; they then expire with the event TTL)."""
        try:
            data = self.api.request("DELETE", f"/api/v1/namespaces/{self.namespace}/events", verb="deletecollection",
                                    resource="events", query=[("fieldSelector", f"reportingComponent={self.scheduler_name}")])
        except Exception as e:  # noqa: BLE001 - cleanup is best effort
            log.warning("the bench's Events were not deleted (%s); they expire with the API server's event TTL, or: "
                        "kubectl delete events -n %s --field-selector reportingComponent=%s",
                        e, self.namespace, self.scheduler_name)
            return None
        return len(data.get("items") or []) if isinstance(data, dict) else 0

    def delete_objects(self) -> None:
        """Delete the bench pods (also those of a baseline that was interrupted) and the nodes made
        (best effort)."""
        self._delete(self._names + self._baseline_names)
        self._names, self._baseline_names = [], []
        for name in self._made_nodes:
            try:
                self.api.request("DELETE", f"/api/v1/nodes/{name}", verb="delete", resource="nodes")
            except Exception:  # noqa: BLE001 - cleanup
                pass
        self._names, self._made_nodes = [], []
