"""KubeCluster: the cluster contract (`shardsched.cluster.ClusterBackend`) over a real API server.

The coordinator consumes it through `shardsched.sharding.calls.ClusterClient` exactly like the
simulated cluster:

- ``list_nodes() -> (nodes, rv)``, ``list_pods() -> (pods, rv)``, ``list_namespaces() -> (namespaces,
  rv)``, ``list_pdbs() -> (pdbs, rv)``, ``list_spread_selectors() -> (objects, rv)``: the informers' caches (camelCase dicts, as the API server sent them) and a sequence
  number; ``events_since(rv, kinds, limit, wait_s)``: the changes after it, raising
  `shardsched.cluster.Gone` when the log no longer reaches back. The informers
  (`shardsched.kube.informer` over the watches of `shardsched.kube.watches`) list then watch nodes,
  namespaces, PodDisruptionBudgets, Services, ReplicationControllers, ReplicaSets, StatefulSets, the pods bound to any node, and our pending pods (server-side field selectors), with
  bookmarks, relisting on 410 and reconnecting with backoff; they start on the first list and that
  first list waits for the caches to sync.
- ``record_event(ref, type, reason, message)`` and ``set_pod_condition(ns, name, condition)``:
  queued and written in the background (`shardsched.kube.writers`); a preemption's writes
  (``delete_pod``, ``set_disruption_target``, ``set_nominated_node_name``, ``prepare_candidates``)
  and VolumeBinding's (``bind_volume``, ``set_selected_node``) are synchronous requests whose typed
  errors (`Forbidden`, `NotFound`, `Conflict`) the caller acts on (`shardsched.kube.object_writes`).
- ``missing_permissions``: the RBAC check `serve` makes at start (`shardsched.kube.permissions`).

Shards bind through ``bind_many`` (the `BindTarget` protocol): the ``pods/binding`` subresource,
concurrently on the asyncio connection of `shardsched.kube.aio` (at most ``bind_workers`` requests
in flight), each request taking a token from a client-side token bucket, and
the answer mapped to the codes the shard understands (201; 404 and 409 passed through; 429, 5xx,
connect failures -> 500, not applied; 504 and read timeouts -> 504, maybe applied). After a 201 it
records the ``Scheduled`` Event ("Successfully assigned ns/pod to node") as kube-scheduler does after
its Bind succeeds: the hook is the bind call itself (the Events of a call's binds are queued when
the call returns), so the Event is written by the process that bound the pod and only for binds
that succeeded.

The object is plain and picklable (its `ClientSpec` and options): every process that receives a
copy (the coordinator actor, each shard actor) builds its own API client on first use, and a copy
that only binds never starts informers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Iterable, Mapping, Sequence

from kubernetes import client as k8s

from shardsched.errors import PermanentError
from shardsched.kube.aio import AioApi
from shardsched.kube.client import Api, ClientSpec, TokenBucket, Unreachable, classify
from shardsched.kube.informer import Reflector
from shardsched.kube.watches import Store, watch_specs
from shardsched.kube.gate import BindsFirst
from shardsched.kube.object_writes import ObjectWrites
from shardsched.kube.permissions import missing_permissions
from shardsched.kube.writers import EventRecorder, StatusWriter
from shardsched.api.volumes import BIND_COMPLETED_ANNOTATION
from shardsched.cluster import (BOUND, CONFLICT, CSI_NODE, CSI_STORAGE_CAPACITY, MAYBE_APPLIED, NAMESPACE, NODE,
                                NOT_APPLIED, NOT_FOUND, PDB, POD, PODGROUP, PV, PVC, SPREAD_SELECTOR_KINDS, STORAGE_CLASS,
                                STORAGE_KINDS,
                                BindResult, Capabilities, Timeout, WatchEvent)

log = logging.getLogger(__name__)

class KubeCluster(ObjectWrites):
    """See the module docstring.

    Args:
        spec: how to reach the API server, and the rate limit (``qps``/``burst``).
        scheduler_names: the profiles' schedulerNames: the pending pods watched are theirs.
        bind_share: fraction of ``spec.qps``/``burst`` this copy may use for binds (1/shards when
            every shard has its own copy, so that together they keep kube-scheduler's client
            budget). Events, conditions, lists and watches have a bucket of the full size, as
            kube-scheduler's event client is separate from its main client.
        bind_workers: most bind requests in flight per `bind_many` call, i.e. per binding cycle of a
            shard (shards that share this object each have theirs, as with a copy per shard actor).
        watch_timeout_s: server-side timeout of one watch call (reconnects after it).
        log_limit: changes kept for ``events_since``.
        emit_scheduled: record the ``Scheduled`` Event after each successful bind.
        pod_groups: also list and watch the PodGroups (``scheduling.x-k8s.io/v1alpha1``; a profile
            has Coscheduling): `list_pod_groups`, their events, `GANG_PERMISSIONS` checked. Their
            CRD must be installed (``deploy/crds/``); without it the PodGroup informer keeps
            retrying and reports it in `health`.
        watch_storage: also list and watch PersistentVolumes, claims, StorageClasses, CSINodes and
            CSIStorageCapacities (the kinds join ``capabilities.kinds``; `STORAGE_PERMISSIONS` are
            then needed too), for the volume plugins and VolumeBinding's PreBind writes
            (`bind_volume`, `set_selected_node`, `claim_bound`).

    Raises (from the protocol methods): `PermanentError` for a bad kubeconfig or RBAC denied on the
    initial list, `TemporaryError` when the API server is unreachable; later failures of the
    informers are retried in the background and reported by `health`.
    """

    #: a copy per process (`shardsched.cluster.PerProcessBackend`); Events and conditions yield
    #: to the binds (``gate``)
    capabilities = Capabilities(kinds=frozenset({NODE, POD, NAMESPACE, PDB, *SPREAD_SELECTOR_KINDS}), per_process=True)

    def __init__(self, spec: ClientSpec, scheduler_names: Sequence[str], *, bind_share: float = 1.0,
                 bind_workers: int = 32, watch_timeout_s: float = 300.0, log_limit: int = 100_000,
                 emit_scheduled: bool = True, pod_groups: bool = False, watch_storage: bool = False) -> None:
        if not scheduler_names:
            raise ValueError("scheduler_names: at least one schedulerName is needed")
        self._args = dict(spec=spec, scheduler_names=list(scheduler_names), bind_share=bind_share,
                          bind_workers=bind_workers, watch_timeout_s=watch_timeout_s, log_limit=log_limit,
                          emit_scheduled=emit_scheduled, pod_groups=pod_groups, watch_storage=watch_storage)
        self.spec = spec
        self.watch_storage = watch_storage
        self.scheduler_names = list(scheduler_names)
        self.bind_share = bind_share
        self.bind_workers = bind_workers
        self.watch_timeout_s = watch_timeout_s
        self.emit_scheduled = emit_scheduled
        self.pod_groups = pod_groups
        if pod_groups:
            self.capabilities = Capabilities(kinds=self.capabilities.kinds | {PODGROUP}, per_process=True)
        if watch_storage:
            self.capabilities = Capabilities(kinds=self.capabilities.kinds | set(STORAGE_KINDS), per_process=True)
        self.store = Store(watch_specs(self.scheduler_names, pod_groups, storage=watch_storage), log_limit)
        self._lock = threading.RLock()
        self._client: k8s.ApiClient | None = None
        self._api: Api | None = None
        self._bind_bucket: TokenBucket | None = None
        self._aio: AioApi | None = None
        self._bind_api: AioApi | None = None
        self._recorder: EventRecorder | None = None
        self._status: StatusWriter | None = None
        # the Events and conditions of this copy yield to its binds; a call that fills a binding
        # cycle's request slots is a burst
        self.gate = BindsFirst(burst_pods=bind_workers)
        self._reflectors: list[Reflector] = []
        self._started = False
        self._draining = False  # `drain_binds`: binds not yet sent answer NOT_APPLIED
        self._stopped = False
        self.bind_counts: dict[int, int] = {}
        self._last_rbac_log = 0.0

    # ------------------------------------------------------------------ pickling (one client per process)
    def __getstate__(self) -> dict:
        return dict(self._args)

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # ------------------------------------------------------------------ lazy parts
    def _connection(self) -> Api:
        with self._lock:
            if self._api is None:
                self._client = self.spec.api_client(pool_size=self.bind_workers + 8)
                timeouts = (self.spec.connect_timeout_s, self.spec.request_timeout_s)
                self._api = Api(self._client, TokenBucket(self.spec.qps, self.spec.burst), timeouts)
            return self._api

    def _writes(self) -> AioApi:
        """The asyncio connection of the per-pod writes (binds, Events, conditions), under the
        full-size rate limiter of `_connection` (binds take a view with their own share)."""
        with self._lock:
            if self._aio is None:
                self._connection()
                # room for the binding cycles of a few shards (threads mode shares this object)
                self._aio = AioApi(self.spec, self._api.bucket, pool_size=4 * self.bind_workers + 8)
            return self._aio

    def _binder(self) -> AioApi:
        """The binding connection: the writes' connection with this binder's share of the rate limit."""
        with self._lock:
            if self._bind_api is None:
                share = min(1.0, max(self.bind_share, 1e-6))
                self._bind_bucket = TokenBucket(self.spec.qps * share, max(1, round(self.spec.burst * share)))
                self._bind_api = self._writes().with_bucket(self._bind_bucket)
            return self._bind_api

    def recorder(self) -> EventRecorder:
        with self._lock:
            if self._recorder is None:
                self._recorder = EventRecorder(self._writes(), self.scheduler_names[0], gate=self.gate)
            return self._recorder

    def _status_writer(self) -> StatusWriter:
        with self._lock:
            if self._status is None:
                self._status = StatusWriter(self._writes(), self.store.pod, gate=self.gate)
            return self._status

    def start(self) -> None:
        """List every watched collection (the caches are synced when this returns), then start the
        watch threads. Idempotent; safe to call again after it raised.

        Raises: `PermanentError` (kubeconfig, RBAC: the message names verb and resource),
        `TemporaryError` (API server unreachable or answering errors or garbage).
        """
        with self._lock:
            if self._started:
                return
            api = self._connection()
            if not self._reflectors:
                self._reflectors = [Reflector(api, self.store, s, self.watch_timeout_s) for s in self.store.specs.values()]
            for r in self._reflectors:
                if not r.stats.synced:
                    r.list()
            for r in self._reflectors:
                r.start()
            self._started = True

    def open_connections(self, binding_cycles: int) -> int:
        """Open the connections that ``binding_cycles`` concurrent `bind_many` calls use
        (`AioApi.open_connections`: ``bind_workers`` each, at most the bind rate limit's burst), so
        that a burst's first binds do not wait for TLS handshakes: kube-scheduler's client has its
        connection from its first list on. Returns how many opened; never raises."""
        count = max(1, binding_cycles) * self.bind_workers
        if self.spec.qps > 0:
            count = min(count, max(1, round(self.spec.burst * min(1.0, self.bind_share))))
        try:
            writes = self._writes()
            return writes.run(writes.open_connections(count), timeout_s=self.spec.connect_timeout_s + 10.0)
        except Exception as e:  # noqa: BLE001 - an optimisation: the binds open what they need
            log.info("opening %d connections ahead of the binds: %s", count, e)
            return 0

    # ------------------------------------------------------------------ the cluster protocol
    def list_nodes(self) -> tuple[list[dict], int]:
        """All nodes, and the sequence number to pass to `events_since` (pins the pods of the same
        moment for the next `list_pods`). Raises: see `start`."""
        self.start()
        return self.store.list_nodes()

    def list_pods(self) -> tuple[list[dict], int]:
        """Our pending pods and every non-terminal bound pod, and the sequence number. Raises: see
        `start`."""
        self.start()
        return self.store.list_pods()

    def list_namespaces(self) -> tuple[list[dict], int]:
        """Every Namespace object, and the sequence number. Raises: see `start`."""
        self.start()
        return self.store.list_namespaces()

    def list_pdbs(self) -> tuple[list[dict], int]:
        """Every PodDisruptionBudget (``policy/v1``), and the sequence number. Raises: see `start`."""
        self.start()
        return self.store.list_pdbs()

    def list_spread_selectors(self) -> tuple[list[dict], int]:
        """Every Service, ReplicationController, ReplicaSet and StatefulSet, and the sequence
        number. Raises: see `start`."""
        self.start()
        return self.store.list_spread_selectors()

    def list_pod_groups(self) -> tuple[list[dict], int]:
        """Every PodGroup (``scheduling.x-k8s.io/v1alpha1``; none unless built with
        ``pod_groups``), and the sequence number. Raises: see `start`."""
        self.start()
        return self.store.list_pod_groups()

    def list_storage(self, kind: str) -> tuple[list[dict], int]:
        """Every object of one storage kind (`shardsched.cluster.STORAGE_KINDS`; [] without
        ``watch_storage``), and the sequence number. Raises: see `start`."""
        self.start()
        return self.store.list_storage(kind)

    def list_pvs(self) -> tuple[list[dict], int]:
        """Every PersistentVolume (with ``watch_storage``; else []), and the sequence number."""
        return self.list_storage(PV)

    def list_pvcs(self) -> tuple[list[dict], int]:
        """Every PersistentVolumeClaim (with ``watch_storage``), and the sequence number."""
        return self.list_storage(PVC)

    def list_storage_classes(self) -> tuple[list[dict], int]:
        """Every StorageClass (with ``watch_storage``), and the sequence number."""
        return self.list_storage(STORAGE_CLASS)

    def list_csi_nodes(self) -> tuple[list[dict], int]:
        """Every CSINode (with ``watch_storage``), and the sequence number."""
        return self.list_storage(CSI_NODE)

    def list_csi_storage_capacities(self) -> tuple[list[dict], int]:
        """Every CSIStorageCapacity (with ``watch_storage``), and the sequence number."""
        return self.list_storage(CSI_STORAGE_CAPACITY)

    # ------------------------------------------------------------------ VolumeBinding's writes
    def get_capabilities(self) -> Capabilities:
        """This copy's `capabilities` (the storage kinds with ``watch_storage``, the PodGroups
        with ``pod_groups``), as a call (`shardsched.cluster.ClusterBackend.get_capabilities`)."""
        return self.capabilities

    def claim_bound(self, namespace: str, claim: str) -> bool:
        """Whether the watched claim has ``volumeName`` and the PV controller's bind-completed
        annotation (False while the watch has not shown it)."""
        obj = self.store.storage_object(PVC, f"{namespace}/{claim}") or {}
        return bool((obj.get("spec") or {}).get("volumeName")) and BIND_COMPLETED_ANNOTATION in (
            (obj.get("metadata") or {}).get("annotations") or {})

    def events_since(self, rv: int | str, kinds: Iterable[str] | None = None,
                     limit: int | None = None, wait_s: float | None = None) -> tuple[list[WatchEvent], int]:
        """Changes after ``rv`` (`Store.since`; with ``wait_s``, a long poll of the informers'
        store). Raises: `Gone` (list again), `Invalid`."""
        self.start()
        return self.store.since(rv, kinds, limit, wait_s)

    def record_event(self, obj_ref: Mapping[str, Any], type: str, reason: str, message: str) -> None:  # noqa: A002
        """Queue an Event (``events.k8s.io/v1``, or core/v1 on old servers) about ``obj_ref``;
        ``reportingController`` is the pod's schedulerName when the pod is in the cache. Never
        blocks; dropped (and counted) only when 10,000 Events are waiting."""
        controller = None
        if obj_ref.get("kind") == "Pod":
            pod = self.store.pod(obj_ref.get("namespace") or "default", obj_ref.get("name") or "")
            controller = ((pod or {}).get("spec") or {}).get("schedulerName")
        self.recorder().emit(obj_ref, type, reason, message, controller)

    def set_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> None:
        """Queue a pod condition update through ``pods/status`` (coalesced per pod; skipped when the
        pod already has it). Never blocks."""
        self._status_writer().set_condition(namespace, name, condition)

    # ------------------------------------------------------------------ binding
    def bind_many(self, bindings: Sequence[tuple]) -> list[BindResult]:
        """Bind pods through ``pods/binding``, concurrently; one result per item, in order, never
        raising for an item (codes in the module docstring).

        Args:
            bindings: (namespace, name, node), (namespace, name, node, uid) or (namespace, name,
                node, uid, annotations); the uid is sent as the Binding's ``metadata.uid``
                precondition (a re-created pod answers 409), the annotations as its
                ``metadata.annotations``, which the API server sets on the pod.
        """
        if not bindings:
            return []
        api = self._binder()
        with self.gate.binding(len(bindings)):
            results = api.run(self._bind_all(api, bindings))
        if self.emit_scheduled:
            self._emit_scheduled(bindings, results)
        with self._lock:
            for r in results:
                self.bind_counts[r.code] = self.bind_counts.get(r.code, 0) + 1
        return results

    async def _bind_all(self, api: AioApi, bindings: Sequence[tuple]) -> list[BindResult]:
        slots = asyncio.Semaphore(self.bind_workers)  # per call: each shard's binding cycle has its own
        return list(await asyncio.gather(*(self._bind_one(api, slots, *b) for b in bindings)))

    async def _bind_one(self, api: AioApi, slots: asyncio.Semaphore, namespace: str, name: str, node: str,
                        uid: str | None = None, annotations: Mapping[str, str] | None = None) -> BindResult:
        resource = f"pods/binding ({namespace}/{name} -> {node})"
        meta = {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})}
        if annotations:
            # set on the pod by the API server in the update that binds it (BindingREST's
            # assignPod): atomic with the binding, one request, no pods/patch permission
            meta["annotations"] = dict(annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # A request of the client's generic call path, not the typed `create_namespaced_pod_binding`:
        # the typed method validates its arguments and builds and serializes models, which cost 60%
        # more CPU per bind than the request itself (docs/kubernetes.md, Benchmark), and it cannot
        # read the Status the server answers anyway (kubernetes-client/python#547).
        try:
            async with slots:
                if self._draining:  # stopping: not sent; the shard puts the pod back, releases its reservation
                    return BindResult(namespace, name, node, NOT_APPLIED, "Stopping", "not sent: shardsched is stopping")
                status, headers, data = await api.send("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                                                       verb="create", resource=resource, body=body)
        except (Timeout, Unreachable) as e:  # no answer: a read timeout may hide an applied bind
            code = MAYBE_APPLIED if isinstance(e, Timeout) else NOT_APPLIED
            return BindResult(namespace, name, node, code, type(e).__name__, str(e))
        except Exception as e:  # noqa: BLE001 - never raise for one item
            log.exception("bind of %s/%s failed unexpectedly", namespace, name)
            return BindResult(namespace, name, node, NOT_APPLIED, "InternalError", f"{type(e).__name__}: {e}")
        if not 200 <= status <= 299:
            err = classify(status, data, "create", resource, headers)
            if status in (NOT_FOUND, CONFLICT):
                return BindResult(namespace, name, node, status, getattr(err, "reason", ""), str(err))
            if isinstance(err, PermanentError):
                self._log_rbac(err)
            code = MAYBE_APPLIED if status == 504 else NOT_APPLIED
            return BindResult(namespace, name, node, code, getattr(err, "reason", ""), str(err))
        return BindResult(namespace, name, node, BOUND)

    def _emit_scheduled(self, bindings: Sequence[tuple], results: list[BindResult]) -> None:
        """The ``Scheduled`` Event of each pod bound, queued by the calling thread (not on the
        event loop, where the writer's locks would stall the binds still in flight)."""
        for b, r in zip(bindings, results):
            if r.code != BOUND:
                continue
            namespace, name, node = b[0], b[1], b[2]
            uid = b[3] if len(b) > 3 else None
            try:
                self.recorder().emit({"kind": "Pod", "apiVersion": "v1", "namespace": namespace, "name": name,
                                      "uid": uid}, "Normal", "Scheduled", f"Successfully assigned {namespace}/{name} to {node}")
            except Exception:  # noqa: BLE001 - the pod is bound; an Event must not turn that into an error
                log.exception("Scheduled event for %s/%s not queued", namespace, name)

    def _log_rbac(self, err: Exception) -> None:
        now = time.monotonic()
        if now - self._last_rbac_log > 60:
            self._last_rbac_log = now
            log.error("%s", err)

    def missing_permissions(self, lease_namespace: str | None = None, lease_name: str | None = None) -> list[str]:
        """The RBAC this copy needs and lacks (`shardsched.kube.permissions.missing_permissions`,
        with the PodGroups' and the storage kinds' verbs when it watches them).
        Raises: `Unauthorized`, `TemporaryError`."""
        return missing_permissions(self._connection(), self.pod_groups, self.watch_storage, lease_namespace, lease_name)

    # ------------------------------------------------------------------ operations
    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until queued Events and condition updates are written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        ok = True
        for writer in (self._recorder, self._status):
            if writer is not None:
                ok = writer.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def cut_watches(self) -> None:
        """Break every watch connection (each resumes from its last resourceVersion)."""
        for r in self._reflectors:
            r.cut()

    def health(self) -> dict[str, Any]:
        """Plain status: ``synced`` (every initial list done), per-watch counters and last errors,
        ``permanent_error`` (the newest RBAC/credential failure of a watch, or ""), bind codes,
        writer counters."""
        watches = {r.spec.name: vars(r.stats).copy() for r in self._reflectors}
        permanent = next((s["last_error"] for s in watches.values() if s["last_error_permanent"] and s["errors"]), "")
        return {
            "synced": bool(self._reflectors) and all(r.stats.synced for r in self._reflectors),
            "watches": watches, "objects": self.store.counts(), "permanent_error": permanent,
            "binds": dict(self.bind_counts),
            "events": self._recorder.stats if self._recorder else {},
            "conditions": dict(self._status.queue.stats) if self._status else {},
        }

    def metric_samples(self) -> list[tuple[str, str, str, list[tuple[str, dict, float]]]]:
        """This backend's counters in `ShardMetrics.samples` form, for `AggregateCollector`."""
        def counter(name: str, doc: str, samples: list[tuple[dict, float]]):
            return (name, "counter", doc, [(name + "_total", labels, float(v)) for labels, v in samples])

        stats = {r.spec.name: r.stats for r in self._reflectors}
        families = [
            counter("shardsched_kube_watch_events", "Watch events applied, by watch.",
                    [({"watch": w}, s.events) for w, s in stats.items()]),
            counter("shardsched_kube_watch_calls", "Watch calls made (reconnects included), by watch.",
                    [({"watch": w}, s.watches) for w, s in stats.items()]),
            counter("shardsched_kube_lists", "Lists made (initial and after 410 Gone), by watch.",
                    [({"watch": w}, s.lists) for w, s in stats.items()]),
            counter("shardsched_kube_watch_errors", "List/watch errors retried with backoff, by watch.",
                    [({"watch": w}, s.errors) for w, s in stats.items()]),
            counter("shardsched_kube_garbage", "Answers from the API server that could not be parsed, by watch.",
                    [({"watch": w}, s.garbage) for w, s in stats.items()]),
            counter("shardsched_kube_binds", "Bind requests by result code (201, 404, 409, 500, 504).",
                    [({"code": str(c)}, n) for c, n in sorted(self.bind_counts.items())]),
            counter("shardsched_kube_writes_held_for_binds",
                    "Event and condition writes that waited for binds in flight (binds first: this process's, or any shard's).",
                    [({}, self.gate.waits)]),
        ]
        for stats, name in ((self._recorder and self._recorder.stats, "events"),
                            (self._status and self._status.queue.stats, "conditions")):
            if stats:
                families.append(counter(f"shardsched_kube_{name}_written", f"{name} written, by outcome.",
                                        [({"outcome": k}, v) for k, v in stats.items()]))
        return families

    def drain_binds(self) -> None:
        """Send no more binds: those a binding cycle holds but has not sent yet answer NOT_APPLIED
        (their pods go back to the queue and their reservations are released, as for any bind not
        applied); binds in flight finish. Called first when the whole scheduler stops, so that a
        Ctrl-C does not wait for a binding cycle's whole batch to be bound."""
        self._draining = True

    def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Stop the informers and writers, after writing what they queue (the Events and
        conditions already decided; binds are no longer in flight, so nothing holds them back) for
        up to ``flush_timeout_s``; what is left then is dropped and logged with its count.
        Idempotent: a second call returns at once (what the first could not write is not retried)."""
        if self._stopped:
            return
        self._stopped = True
        if not self.flush(flush_timeout_s):
            left = sum(len(q._items) for q in self._recorder.queues) if self._recorder else 0
            log.warning("stopping: %d Events and the conditions still queued were not written within %g s",
                        left, flush_timeout_s)
        for r in self._reflectors:
            r.stop()
        for writer in (self._recorder, self._status):
            if writer is not None:
                writer.stop()
        if self._aio is not None:
            self._aio.close()

