"""The simulated cluster served over a subset of the Kubernetes REST API, on 127.0.0.1.

`SimApiServer` puts a `SimCluster` behind the endpoints shardsched's Kubernetes backend uses, with
the API server's wire behaviour, so that `serve` and `KubeCluster` run end to end without a real
cluster (demos, ``serve --bench`` against it, and the tests' HTTP peer). Standard library only
(``http.server``); HTTP/1.1 with keep-alive, chunked watch streams.

Served (JSON only):

- ``GET /version``; ``GET /apis/events.k8s.io/v1`` (discovery; 404 with ``events_api=False``);
- namespaces: list and watch, create (``POST``), replace (``PUT``: labels) and delete (with the pods in
  it); ``GET /api/v1/namespaces/{name}`` of a namespace never created answers one that exists (the
  simulated cluster takes pods in any namespace), with only its name label;
- nodes and pods: list (``fieldSelector`` on ``spec.nodeName``, ``spec.schedulerName``,
  ``status.phase``, ``metadata.name``, ``metadata.namespace`` with ``=``, ``==``, ``!=``;
  ``labelSelector`` with equality and existence terms; ``limit`` and ``continue`` paging, except
  for ``resourceVersion=0``, answered whole as kube's watch cache does) and watch (``resourceVersion``, ``allowWatchBookmarks``, ``timeoutSeconds``;
  an object that stops matching the selector is sent as DELETED with its previous state, as kube's
  cacher does; a resourceVersion older than `SimApiServer.compact` answers an ERROR event with
  code 410); get, create and delete of pods;
- ``POST .../pods/{name}/binding`` and ``POST .../bindings``: 201 with a ``Status`` body (as the real
  server, which the official client cannot deserialize), 404, 409;
- ``PATCH .../pods/{name}/status`` (strategic merge of ``status.conditions`` by type, and
  ``status.nominatedNodeName``, ``null`` removing it); ``DELETE`` of a pod with ``DeleteOptions``
  (``preconditions.uid``: 409 when it differs; ``gracePeriodSeconds``), graceful as the simulated
  cluster deletes;
- ``PATCH /api/v1/nodes/{name}[/status]`` (``spec.taints`` replaced, ``status.conditions`` merged
  by type: what a kubelet-less node registration writes);
- Events: create, merge-patch and delete-collection (``fieldSelector`` on the reporting controller,
  ``reason``, ``type``) in ``events.k8s.io/v1`` and ``v1`` (kept in `SimApiServer.events`
  and recorded in the simulated cluster too);
- the storage kinds (PersistentVolumes, claims, StorageClasses, CSINodes, CSIStorageCapacities):
  list and watch, create, get, replace, delete, and PATCH of a PV's ``spec.claimRef`` and a claim's
  ``volume.kubernetes.io/selected-node`` annotation (the simulated PV controller then binds or
  provisions);
- PodDisruptionBudgets (``policy/v1``): list and watch (all namespaces or one), create, get,
  replace and delete, their status computed by the simulated cluster;
- Leases (``coordination.k8s.io/v1``): get, create (409 AlreadyExists), update (409 on a stale
  ``metadata.resourceVersion``);
- ``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``;
- ``GET /metrics`` (Prometheus text): ``apiserver_request_duration_seconds`` of its binds (labels
  ``verb``, ``resource``, ``subresource`` as kube's) and ``process_cpu_seconds_total`` of the
  process serving it (all of it: in the tests, the test process), what ``serve --bench`` reads.

Test controls: ``token`` (requests without ``Authorization: Bearer <token>`` answer 401), `deny`
(RBAC: 403 for a verb on a resource), `fail` (the next N matching requests answer a status, a
garbage body, or a dropped connection), `cut_watches` (close every open watch), `compact` (watches
from before now answer 410).
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, ProcessCollector, generate_latest

from shardsched.api.podaffinity import NAMESPACE_NAME_LABEL
from shardsched.cluster import (ADDED, CSI_NODE, CSI_STORAGE_CAPACITY, DELETED, MODIFIED, NAMESPACE, NODE, PDB, POD,
                                PODGROUP, PV, PVC, SPREAD_SELECTOR_KINDS, STORAGE_CLASS, STORAGE_KINDS, AlreadyExists,
                                ApiError, Conflict, NotFound)
from shardsched.sim.cluster import SimCluster

_PODS = re.compile(r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?pods(?:/(?P<name>[^/]+)(?:/(?P<sub>binding|status))?)?$")
_NAMESPACE = re.compile(r"^/api/v1/namespaces(?:/(?P<name>[^/]+))?$")
_BINDINGS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/bindings$")
_NODES = re.compile(r"^/api/v1/nodes(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$")
_EVENTS = re.compile(r"^/(?:api/v1|apis/events\.k8s\.io/v1)/namespaces/(?P<ns>[^/]+)/events(?:/(?P<name>[^/]+))?$")
_PDBS = re.compile(r"^/apis/policy/v1/(?:namespaces/(?P<ns>[^/]+)/)?poddisruptionbudgets(?:/(?P<name>[^/]+))?$")
_PODGROUPS = re.compile(r"^/apis/scheduling\.x-k8s\.io/v1alpha1/(?:namespaces/(?P<ns>[^/]+)/)?podgroups(?:/(?P<name>[^/]+))?$")
_STORAGE = re.compile(r"^/api(?:s/storage\.k8s\.io)?/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<res>persistentvolumes|"
                      r"persistentvolumeclaims|storageclasses|csinodes|csistoragecapacities)(?:/(?P<name>[^/]+))?$")
#: the storage resources served -> their kind
_STORAGE_KINDS = {"persistentvolumes": PV, "persistentvolumeclaims": PVC, "storageclasses": STORAGE_CLASS,
                  "csinodes": CSI_NODE, "csistoragecapacities": CSI_STORAGE_CAPACITY}
_LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases(?:/(?P<name>[^/]+))?$")
#: Services, ReplicationControllers, ReplicaSets and StatefulSets (default spreading's selectors):
#: (path pattern, resource, kind, apiVersion)
_SPREAD = tuple((re.compile(rf"^/{prefix}/(?:namespaces/(?P<ns>[^/]+)/)?{resource}(?:/(?P<name>[^/]+))?$"), resource,
                 kind, version)
                for prefix, version, resource, kind in (("api/v1", "v1", "services", "Service"),
                                                        ("api/v1", "v1", "replicationcontrollers", "ReplicationController"),
                                                        ("apis/apps/v1", "apps/v1", "replicasets", "ReplicaSet"),
                                                        ("apis/apps/v1", "apps/v1", "statefulsets", "StatefulSet")))
_API_VERSION = {PDB: "policy/v1", PODGROUP: "scheduling.x-k8s.io/v1alpha1", **{kind: version for _, _, kind, version in _SPREAD},
                STORAGE_CLASS: "storage.k8s.io/v1", CSI_NODE: "storage.k8s.io/v1", CSI_STORAGE_CAPACITY: "storage.k8s.io/v1"}
_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


def status_body(code: int, reason: str, message: str) -> dict:
    """A ``metav1.Status`` as the API server sends it."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" if code < 300 else "Failure",
            "message": message, "reason": reason, "code": code}


class Selector:
    """A field selector ``a=b,c!=d`` over dotted paths of the object, and optionally an
    equality-based label selector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``; set-based terms
    such as ``k in (a,b)`` are not served)."""

    def __init__(self, text: str, labels: str = "") -> None:
        self.terms: list[tuple[str, bool, str]] = []
        for part in filter(None, (text or "").split(",")):
            neg = "!=" in part
            key, value = re.split(r"!=|==|=", part, maxsplit=1)
            self.terms.append((key.strip(), neg, value.strip()))
        #: (label key, negated, value or None for an existence test)
        self.label_terms: list[tuple[str, bool, str | None]] = []
        for part in filter(None, (p.strip() for p in (labels or "").split(","))):
            if "=" in part:
                neg = "!=" in part
                key, value = re.split(r"!=|==|=", part, maxsplit=1)
                self.label_terms.append((key.strip(), neg, value.strip()))
            else:
                self.label_terms.append((part.lstrip("!").strip(), part.startswith("!"), None))

    def matches(self, obj: dict) -> bool:
        for key, neg, value in self.terms:
            cur: Any = obj
            for p in key.split("."):
                cur = cur.get(p) if isinstance(cur, dict) else None
            if ((cur or "") == value) == neg:
                return False
        labels = (obj.get("metadata") or {}).get("labels") or {}
        for key, neg, value in self.label_terms:
            hit = key in labels if value is None else labels.get(key) == value
            if hit == neg:
                return False
        return True


@dataclass
class _Fault:
    method: str
    path: re.Pattern
    query: str
    status: int
    action: str  # "status" | "garbage" | "drop"
    times: int


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.server.owner.handle(self)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def read_body(self) -> None:
        """Read the request body (always, so a keep-alive connection stays in step)."""
        n = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(n) if n else b""

    def body(self) -> Any:
        return json.loads(self._raw) if self._raw else None

    def reply(self, code: int, data: Any, raw: bytes | None = None, content_type: str = "application/json") -> None:
        payload = raw if raw is not None else json.dumps(data).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # many concurrent clients (binds from a pool) must not be reset
    owner: "SimApiServer"


class SimApiServer:
    """See the module docstring.

    Args:
        sim: the cluster served (a new empty `SimCluster` by default).
        token: bearer token required from clients (None = no authentication).
        events_api: serve ``events.k8s.io/v1`` (False = only core/v1 Events, as very old servers).
        bookmark_s: bookmark period of watches that allow them.
    """

    def __init__(self, sim: SimCluster | None = None, token: str | None = None, events_api: bool = True,
                 bookmark_s: float = 1.0, port: int = 0) -> None:
        self.sim = sim or SimCluster()
        self.token = token
        self.events_api = events_api
        self.bookmark_s = bookmark_s
        self.events: dict[tuple[str, str], dict] = {}  # (namespace, event name) -> Event
        self.leases: dict[tuple[str, str], dict] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path) served, for tests
        self.queries: list[tuple[str, str, dict]] = []  # (method, path, query parameters), for tests
        self._lease_rv = 0
        self._faults: list[_Fault] = []
        self._denied: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict] = {}
        self._history: list[tuple[int, str, str, dict, dict | None]] = []  # (rv, type, kind, obj, prev)
        nodes, _ = self.sim.list_nodes()
        pdbs, _ = self.sim.list_pdbs()
        spread, _ = self.sim.list_spread_selectors()
        groups, _ = self.sim.list_pod_groups()
        storage = {kind: self.sim.list_storage(kind)[0] for kind in STORAGE_KINDS}
        pods, self._rv = self.sim.list_pods()
        for n in nodes:
            self._objects[(NODE, n["metadata"]["name"])] = n
        for kind, objs in ((POD, pods), (PDB, pdbs), (PODGROUP, groups), *((k, [o for o in spread if o["kind"] == k])
                                                        for k in SPREAD_SELECTOR_KINDS), *storage.items()):
            for o in objs:
                meta = o["metadata"]
                self._objects[(kind, f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"])] = o
        self._compacted = self._rv
        self._watches: set[socket.socket] = set()
        self.metrics = CollectorRegistry()
        ProcessCollector(registry=self.metrics)
        self._bind_seconds = Histogram("apiserver_request_duration_seconds", "Time to answer a request (binds only).",
                                       ["verb", "resource", "subresource"], registry=self.metrics)
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.owner = self
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "SimApiServer":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="simapi", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.cut_watches()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "SimApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str, token: str | None = None) -> str:
        """Write a kubeconfig pointing at this server (with ``token``, default the server's)."""
        user = {"token": token or self.token} if (token or self.token) else {}
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "sim",
               "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
               "users": [{"name": "sim", "user": user}],
               "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim"}}]}
        with open(path, "w") as f:
            json.dump(doc, f)
        return path

    # ------------------------------------------------------------------ test controls
    def deny(self, verb: str, resource: str) -> None:
        """RBAC: answer 403 to ``verb`` on ``resource`` (``pods``, ``pods/binding``, ``events``, ...)."""
        self._denied.add((verb, resource))

    def allow(self, verb: str, resource: str) -> None:
        self._denied.discard((verb, resource))

    def fail(self, method: str, path_regex: str, status: int = 500, times: int = 1, action: str = "status",
             query: str = "") -> None:
        """The next ``times`` requests ``method path`` (regex, full match; ``query`` a substring of the
        query string) answer ``status`` with a Status body (``action="status"``), 200 with a body that
        is not JSON (``"garbage"``), or have their connection closed unanswered (``"drop"``)."""
        with self._lock:
            self._faults.append(_Fault(method, re.compile(path_regex), query, status, action, times))

    def clear_faults(self) -> None:
        """Forget every fault of `fail` not used up yet: the requests are answered again."""
        with self._lock:
            self._faults.clear()

    def cut_watches(self) -> None:
        """Close every open watch connection (clients resume from their last resourceVersion)."""
        with self._lock:
            socks, self._watches = list(self._watches), set()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def compact(self) -> None:
        """Forget the watch history: a watch from a resourceVersion before now answers 410 Gone."""
        with self._sync_lock:
            self._sync()
            self._compacted = self._rv
            self._history.clear()

    def events_for(self, namespace: str, name: str) -> list[dict]:
        """Events (either API) about ``namespace/name``, oldest first."""
        out = []
        for (ns, _), ev in sorted(self.events.items(), key=lambda kv: kv[1]["metadata"]["creationTimestamp"]):
            ref = ev.get("regarding") or ev.get("involvedObject") or {}
            if ns == namespace and ref.get("name") == name:
                out.append(ev)
        return out

    # ------------------------------------------------------------------ the mirror of the sim's watch
    def _sync(self) -> None:
        """Pull the sim's new events into the history with each object's previous state."""
        events, rv = self.sim.events_since(self._rv)
        for ev in events:
            meta = ev.object["metadata"]
            key = f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]
            prev = self._objects.get((ev.kind, key))
            if ev.type == DELETED:
                self._objects.pop((ev.kind, key), None)
            else:
                self._objects[(ev.kind, key)] = ev.object
            self._history.append((ev.rv, ev.type, ev.kind, ev.object, prev))
        self._rv = rv

    def _snapshot(self, kind: str) -> tuple[list[dict], int]:
        with self._sync_lock:
            self._sync()
            return [o for (k, _), o in self._objects.items() if k == kind], self._rv

    def _after(self, rv: int) -> tuple[list[tuple], int] | None:
        with self._sync_lock:
            self._sync()
            if rv < self._compacted:
                return None
            return [h for h in self._history if h[0] > rv], self._rv

    # ------------------------------------------------------------------ dispatch
    def handle(self, h: _Handler) -> None:
        url = urlsplit(h.path)
        path, query = url.path, parse_qs(url.query)
        q = {k: v[-1] for k, v in query.items()}
        self.requests.append((h.command, path))
        self.queries.append((h.command, path, q))
        h.read_body()
        try:
            if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
                return h.reply(401, status_body(401, "Unauthorized", "Unauthorized"))
            if self._inject(h, path, url.query):
                return
            verb, resource = self._verb_resource(h.command, path, q)
            if (verb, resource) in self._denied:
                return h.reply(403, status_body(403, "Forbidden", f'{resource} is forbidden: User "sim" cannot {verb} '
                                                                  f'resource "{resource}"'))
            self._route(h, path, q, verb)
        except ApiError as e:
            h.reply(e.code, status_body(e.code, e.reason, str(e)))
        except (ConnectionError, BrokenPipeError):
            pass
        except Exception as e:  # noqa: BLE001 - answer 500 like a server would
            try:
                h.reply(500, status_body(500, "InternalError", f"{type(e).__name__}: {e}"))
            except OSError:
                pass

    def _inject(self, h: _Handler, path: str, query: str) -> bool:
        with self._lock:
            fault = next((f for f in self._faults if f.method == h.command and f.path.fullmatch(path)
                          and f.query in query and f.times > 0), None)
            if fault is None:
                return False
            fault.times -= 1
        if fault.action == "garbage":
            h.reply(200, None, raw=b"<html>\n<body>502 Bad Gateway (garbage from a proxy)</body>\n</html>\n")
        elif fault.action == "drop":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
        else:
            h.reply(fault.status, status_body(fault.status, "Injected", f"injected {fault.status}"))
        return True

    @staticmethod
    def _verb_resource(method: str, path: str, q: dict) -> tuple[str, str]:
        """RBAC's view of a request: (verb, resource[/subresource])."""
        resource, named = path, False
        for rx, base in ((_PODS, "pods"), (_BINDINGS, "bindings"), (_NODES, "nodes"), (_EVENTS, "events"),
                         (_LEASES, "leases"), (_NAMESPACE, "namespaces"), (_PDBS, "poddisruptionbudgets"),
                         (_PODGROUPS, "podgroups"), *((rx, resource) for rx, resource, _, _ in _SPREAD),
                         (_STORAGE, None)):
            m = rx.match(path)
            if m:
                base = base or m["res"]
                sub = m.groupdict().get("sub")
                resource = f"{base}/{sub}" if sub else base
                named = bool(m.groupdict().get("name"))
                break
        if method == "GET":
            return ("get" if named else "watch" if q.get("watch") in ("true", "1") else "list"), resource
        if method == "DELETE" and not named and resource != path:
            return "deletecollection", resource
        return _VERBS.get(method, method.lower()), resource

    def _route(self, h: _Handler, path: str, q: dict, verb: str) -> None:
        if path == "/metrics":
            return h.reply(200, None, raw=generate_latest(self.metrics), content_type=CONTENT_TYPE_LATEST)
        m = _NAMESPACE.match(path)
        if m and not m["name"]:
            if h.command == "POST":
                return h.reply(201, self.sim.create_namespace(h.body() or {}))
            return self._list_or_watch(h, NAMESPACE, q)
        if m:
            if h.command == "PUT":
                return h.reply(200, self.sim.update_namespace(h.body() or {}))
            if h.command == "DELETE":
                return h.reply(200, self.sim.delete_namespace(m["name"]))
            if h.command == "GET":
                try:
                    return h.reply(200, self.sim.get_namespace(m["name"]))
                except NotFound:  # never created: it exists all the same, with its name label only
                    return h.reply(200, {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": m["name"], "labels": {NAMESPACE_NAME_LABEL: m["name"]}},
                                         "status": {"phase": "Active"}})
        if path == "/version":
            return h.reply(200, {"major": "1", "minor": "99", "gitVersion": "v1.99.0-shardsched-sim"})
        if path == "/apis/events.k8s.io/v1":
            if not self.events_api:
                raise NotFound("the server could not find the requested resource")
            return h.reply(200, {"kind": "APIResourceList", "groupVersion": "events.k8s.io/v1",
                                 "resources": [{"name": "events", "namespaced": True, "kind": "Event"}]})
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            review = h.body() or {}
            attrs = (review.get("spec") or {}).get("resourceAttributes") or {}
            resource = attrs.get("resource", "") + (f"/{attrs['subresource']}" if attrs.get("subresource") else "")
            allowed = (attrs.get("verb"), resource) not in self._denied
            return h.reply(201, {**review, "status": {"allowed": allowed}})
        m = _NODES.match(path)
        if m:
            if h.command == "POST":
                return h.reply(201, self.sim.create_node(h.body() or {}))
            if m["name"] and h.command == "DELETE":
                return h.reply(200, self.sim.delete_node(m["name"]))
            if m["name"] and h.command == "PATCH":
                return h.reply(200, self._patch_node(m["name"], m["sub"], h.body() or {}))
            if m["name"]:
                return h.reply(200, self.sim.get_node(m["name"]))
            return self._list_or_watch(h, NODE, q)
        m = _BINDINGS.match(path)
        if m:
            return self._bind(h, m["ns"], None)
        m = _PODS.match(path)
        if m:
            return self._pods(h, m["ns"], m["name"], m["sub"], q, verb)
        m = _EVENTS.match(path)
        if m:
            return self._events(h, path, m["ns"], m["name"], q)
        m = _LEASES.match(path)
        if m:
            return self._leases(h, m["ns"], m["name"])
        m = _PDBS.match(path)
        if m:
            return self._pdbs(h, m["ns"], m["name"], q)
        m = _PODGROUPS.match(path)
        if m:
            return self._pod_groups(h, m["ns"], m["name"], q)
        for rx, _, kind, _ in _SPREAD:
            m = rx.match(path)
            if m:
                return self._spread_selectors(h, kind, m["ns"], m["name"], q)
        m = _STORAGE.match(path)
        if m:
            return self._storage(h, _STORAGE_KINDS[m["res"]], m["ns"], m["name"], q)
        raise NotFound("the server could not find the requested resource")

    # ------------------------------------------------------------------ resources
    def _pods(self, h: _Handler, ns: str | None, name: str | None, sub: str | None, q: dict, verb: str) -> None:
        if name is None:
            if h.command == "POST":
                body = h.body() or {}
                body.setdefault("metadata", {})["namespace"] = ns
                return h.reply(201, self.sim.create_pod(body))
            return self._list_or_watch(h, POD, q, ns)
        if sub == "binding":
            return self._bind(h, ns, name)
        if sub == "status" and h.command == "PATCH":
            body = h.body() or {}
            rv = (body.get("metadata") or {}).get("resourceVersion")  # a precondition, as the API server reads it
            status = body.get("status") or {}
            for cond in status.get("conditions") or []:
                self.sim.set_pod_condition(ns, name, cond, resource_version=rv)
            if "nominatedNodeName" in status:  # null removes it
                self.sim.set_nominated_node_name(ns, name, status["nominatedNodeName"] or "")
            return h.reply(200, self.sim.get_pod(ns, name))
        if h.command == "DELETE":
            body = h.body() or {}
            uid = (body.get("preconditions") or {}).get("uid")
            return h.reply(200, self.sim.delete_pod(ns, name, uid, body.get("gracePeriodSeconds")))
        return h.reply(200, self.sim.get_pod(ns, name))

    def _pdbs(self, h: _Handler, ns: str | None, name: str | None, q: dict) -> None:
        if name is None:
            if h.command == "POST" and ns:
                body = h.body() or {}
                body.setdefault("metadata", {})["namespace"] = ns
                return h.reply(201, self.sim.create_pdb(body))
            return self._list_or_watch(h, PDB, q, ns)
        if h.command == "PUT":
            body = h.body() or {}
            body.setdefault("metadata", {}).update(namespace=ns, name=name)
            return h.reply(200, self.sim.update_pdb(body))
        if h.command == "DELETE":
            return h.reply(200, self.sim.delete_pdb(ns, name))
        return h.reply(200, self.sim.get_pdb(ns, name))

    def _pod_groups(self, h: _Handler, ns: str | None, name: str | None, q: dict) -> None:
        if name is None:
            if h.command == "POST" and ns:
                body = h.body() or {}
                body.setdefault("metadata", {})["namespace"] = ns
                return h.reply(201, self.sim.create_pod_group(body))
            return self._list_or_watch(h, PODGROUP, q, ns)
        if h.command == "DELETE":
            return h.reply(200, self.sim.delete_pod_group(ns, name))
        return h.reply(200, self.sim.get_pod_group(ns, name))

    def _spread_selectors(self, h: _Handler, kind: str, ns: str | None, name: str | None, q: dict) -> None:
        """Services, ReplicationControllers, ReplicaSets, StatefulSets: list, watch, create, replace,
        delete (`SimCluster.put_spread_selector`)."""
        if name is None:
            if h.command == "POST" and ns:
                body = h.body() or {}
                body.setdefault("metadata", {})["namespace"] = ns
                return h.reply(201, self.sim.put_spread_selector({**body, "kind": kind}))
            return self._list_or_watch(h, kind, q, ns)
        if h.command == "PUT":
            body = h.body() or {}
            body.setdefault("metadata", {}).update(namespace=ns, name=name)
            return h.reply(200, self.sim.put_spread_selector({**body, "kind": kind}))
        if h.command == "DELETE":
            return h.reply(200, self.sim.delete_spread_selector(kind, ns, name))
        objs, _ = self._snapshot(kind)
        found = next((o for o in objs if o["metadata"]["namespace"] == ns and o["metadata"]["name"] == name), None)
        if found is None:
            raise NotFound(f'{kind.lower()}s "{name}" not found')
        return h.reply(200, found)

    def _storage(self, h: _Handler, kind: str, ns: str | None, name: str | None, q: dict) -> None:
        """The storage kinds: list and watch, create, get, replace, delete; PATCH of a PV's
        ``spec.claimRef`` and of a claim's ``volume.kubernetes.io/selected-node`` annotation (what
        VolumeBinding's PreBind writes)."""
        if name is None:
            if h.command == "POST":
                body = {**(h.body() or {}), "kind": kind}
                if ns:
                    body.setdefault("metadata", {})["namespace"] = ns
                return h.reply(201, self.sim.create_volume_object(body))
            return self._list_or_watch(h, kind, q, ns)
        if h.command == "PUT":
            body = {**(h.body() or {}), "kind": kind}
            body.setdefault("metadata", {}).update(name=name, **({"namespace": ns} if ns else {}))
            return h.reply(200, self.sim.update_volume_object(body))
        if h.command == "DELETE":
            return h.reply(200, self.sim.delete_volume_object(kind, name, ns))
        if h.command == "PATCH":
            body = h.body() or {}
            ref = (body.get("spec") or {}).get("claimRef")
            if kind == PV and ref:
                self.sim.bind_volume(name, ref.get("namespace") or "default", ref["name"], ref.get("uid") or "")
            node = ((body.get("metadata") or {}).get("annotations") or {}).get("volume.kubernetes.io/selected-node")
            if kind == PVC and node:
                self.sim.set_selected_node(ns or "default", name, node)
        return h.reply(200, self.sim.get_volume_object(kind, name, ns))

    def _patch_node(self, name: str, sub: str | None, body: dict) -> dict:
        """The two node patches `shardsched.bench.serve_cluster.register_node` makes: ``status.conditions``
        merged by type (``/status``), ``spec.taints`` replaced (``null`` removes them)."""
        import copy

        node = copy.deepcopy(self.sim.get_node(name))
        if sub == "status":
            conds = {c.get("type"): c for c in (node.get("status") or {}).get("conditions") or []}
            conds.update({c.get("type"): c for c in (body.get("status") or {}).get("conditions") or []})
            node.setdefault("status", {})["conditions"] = list(conds.values())
        elif "taints" in (body.get("spec") or {}):
            taints = body["spec"]["taints"]
            spec = node.setdefault("spec", {})
            if taints is None:
                spec.pop("taints", None)
            else:
                spec["taints"] = taints
        return self.sim.update_node(node)

    def _bind(self, h: _Handler, ns: str, name: str | None) -> None:
        body = h.body() or {}
        meta = body.get("metadata") or {}
        target = (body.get("target") or {}).get("name") or ""
        t0 = time.perf_counter()
        # the Binding's annotations are set on the pod with the binding, as kube-apiserver's assignPod
        result = self.sim.bind_many([(ns, name or meta.get("name"), target, meta.get("uid") or None,
                                      meta.get("annotations") or None)])[0]
        self._bind_seconds.labels("POST", "pods", "binding").observe(time.perf_counter() - t0)
        if result.ok:
            return h.reply(201, status_body(201, "", ""))
        h.reply(result.code, status_body(result.code, result.reason, result.message))

    def _list_or_watch(self, h: _Handler, kind: str, q: dict, ns: str | None = None) -> None:
        sel = Selector(q.get("fieldSelector", ""), q.get("labelSelector", ""))
        in_ns = (lambda o: o["metadata"].get("namespace") == ns) if ns else (lambda o: True)
        if q.get("watch") in ("true", "1"):
            return self._watch(h, kind, sel, in_ns, q)
        objs, rv = self._snapshot(kind)
        items = sorted((o for o in objs if sel.matches(o) and in_ns(o)),
                       key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        start = int(q.get("continue") or 0)
        # resourceVersion=0 is served from kube's watch cache, which ignores limit (one answer)
        limit = 0 if q.get("resourceVersion") == "0" and not start else int(q.get("limit") or 0)
        page = items[start:start + limit] if limit else items[start:]
        meta: dict = {"resourceVersion": str(rv)}
        if limit and start + limit < len(items):
            meta["continue"] = str(start + limit)
        h.reply(200, {"kind": f"{kind}List", "apiVersion": _API_VERSION.get(kind, "v1"), "metadata": meta,
                      "items": page})

    def _watch(self, h: _Handler, kind: str, sel: Selector, in_ns: Callable[[dict], bool], q: dict) -> None:
        rv = int(q.get("resourceVersion") or self._snapshot(kind)[1])
        timeout_s = float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        with self._lock:
            self._watches.add(h.connection)

        def send(event: dict) -> None:
            data = json.dumps(event).encode() + b"\n"
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        deadline = time.monotonic() + timeout_s
        last_bookmark = time.monotonic()
        try:
            while time.monotonic() < deadline:
                got = self._after(rv)
                if got is None:
                    send({"type": "ERROR", "object": status_body(410, "Expired", f"too old resource version: {rv}")})
                    break
                entries, now_rv = got
                for ev_rv, typ, k, obj, prev in entries:
                    if k != kind:
                        continue
                    out = self._convert(typ, obj, prev, sel, in_ns, ev_rv)
                    if out is not None:
                        send({"type": out[0], "object": out[1]})
                rv = now_rv
                if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_s:
                    send({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": "v1",
                                                         "metadata": {"resourceVersion": str(rv)}}})
                    last_bookmark = time.monotonic()
                time.sleep(0.01)
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            h.close_connection = True
        finally:
            with self._lock:
                self._watches.discard(h.connection)

    @staticmethod
    def _convert(typ: str, obj: dict, prev: dict | None, sel: Selector, in_ns: Callable[[dict], bool],
                 ev_rv: int) -> tuple[str, dict] | None:
        """kube's cacher: an object entering the selector is ADDED, leaving it is DELETED (with the
        previous state at this resourceVersion)."""
        ok = lambda o: o is not None and sel.matches(o) and in_ns(o)  # noqa: E731
        if typ == DELETED:
            return (DELETED, obj) if ok(obj) else None
        if ok(obj):
            return (MODIFIED if typ == MODIFIED and ok(prev) else ADDED), obj
        if ok(prev):
            gone = {**prev, "metadata": {**prev["metadata"], "resourceVersion": str(ev_rv)}}
            return DELETED, gone
        return None

    def _events(self, h: _Handler, path: str, ns: str, name: str | None, q: dict) -> None:
        new_api = path.startswith("/apis/")
        if new_api and not self.events_api:
            raise NotFound("the server could not find the requested resource")
        if h.command == "GET" and name is None:
            return h.reply(200, {"kind": "EventList", "items": [e for (n, _), e in self.events.items() if n == ns]})
        if h.command == "DELETE" and name is None:  # deletecollection
            sel = Selector(q.get("fieldSelector", ""))
            unknown = [key for key, _, _ in sel.terms
                       if key not in ("reportingComponent", "reportingController", "reason", "type")]
            if unknown:
                return h.reply(400, status_body(400, "BadRequest", f'"{unknown[0]}" is not a known field selector: '
                                                                 "only reportingComponent, reason, type"))

            def selectable(ev: dict) -> dict:
                # the reporting controller is `reportingController` in events.k8s.io/v1 and
                # `reportingComponent` in core/v1; a selector may name either
                controller = ev.get("reportingController") or ev.get("reportingComponent") or ""
                return {"reportingComponent": controller, "reportingController": controller,
                        "reason": ev.get("reason") or "", "type": ev.get("type") or ""}

            with self._lock:
                gone = [k for k, ev in self.events.items() if k[0] == ns and sel.matches(selectable(ev))]
                items = [self.events.pop(k) for k in gone]
            return h.reply(200, {"kind": "EventList", "items": items})
        if h.command == "POST":
            ev = h.body() or {}
            ev_name = ev["metadata"]["name"]
            with self._lock:
                if (ns, ev_name) in self.events:
                    raise AlreadyExists(f'events "{ev_name}" already exists')
                ev["metadata"].update(namespace=ns, creationTimestamp=time.time(), resourceVersion="1")
                self.events[(ns, ev_name)] = ev
            ref = ev.get("regarding") or ev.get("involvedObject") or {}
            self.sim.record_event(ref, ev.get("type", "Normal"), ev.get("reason", ""),
                                  ev.get("note") if new_api else ev.get("message", ""))
            return h.reply(201, ev)
        with self._lock:
            ev = self.events.get((ns, name))
            if ev is None:
                raise NotFound(f'events "{name}" not found')
            if h.command == "PATCH":
                patch = h.body() or {}
                for k, v in patch.items():
                    ev[k] = {**(ev.get(k) or {}), **v} if isinstance(v, dict) else v
        if h.command == "PATCH":
            ref = ev.get("regarding") or ev.get("involvedObject") or {}
            self.sim.record_event(ref, ev.get("type", "Normal"), ev.get("reason", ""),
                                  ev.get("note") if new_api else ev.get("message", ""))
        h.reply(200, ev)

    def _leases(self, h: _Handler, ns: str, name: str | None) -> None:
        with self._lock:
            if h.command == "POST":
                body = h.body() or {}
                name = body["metadata"]["name"]
                if (ns, name) in self.leases:
                    raise AlreadyExists(f'leases.coordination.k8s.io "{name}" already exists')
            elif (ns, name) not in self.leases:
                raise NotFound(f'leases.coordination.k8s.io "{name}" not found')
            if h.command == "GET":
                return h.reply(200, self.leases[(ns, name)])
            body = h.body() or {}
            if h.command == "PUT":
                have = self.leases[(ns, name)]["metadata"]["resourceVersion"]
                if body.get("metadata", {}).get("resourceVersion") not in (None, have):
                    raise Conflict(f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": '
                                      "the object has been modified; please apply your changes to the latest version")
            self._lease_rv += 1
            body.setdefault("metadata", {}).update(name=name, namespace=ns, resourceVersion=str(self._lease_rv))
            body.setdefault("apiVersion", "coordination.k8s.io/v1")
            body.setdefault("kind", "Lease")
            self.leases[(ns, name)] = body
            return h.reply(201 if h.command == "POST" else 200, body)

