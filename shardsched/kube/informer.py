"""Informers: list, then watch from the list's resourceVersion, relist on 410, reconnect with backoff.

One `Reflector` thread per watch (client-go's Reflector) feeds one `Store` (client-go's informer
store plus a bounded event log). The store serves the cluster protocol the coordinator consumes:
snapshots with a sequence number, and `Store.since` for the events after one (raising `Gone` once
the log no longer reaches back, exactly as the simulated cluster does).

Pods come from two kinds of watch, both filtered on the server, that never send the same pod:

- ``OURS``, one per schedulerName of our profiles:
  ``spec.schedulerName=<name>,status.phase!=Succeeded,status.phase!=Failed`` (our pods, pending
  and bound: no other scheduler's pending pod is ever sent to us);
- ``BOUND``: ``spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed`` plus
  ``spec.schedulerName!=<name>`` for each of ours (every other pod that uses a node, whoever bound
  it: default scheduler, DaemonSets, static pods).

A pod's schedulerName cannot change, so each pod is on exactly one watch and its changes arrive in
order: a bind of one of our pods (by us or by a rival binding it directly) is one MODIFIED event
carrying ``spec.nodeName``, as kube-scheduler's own single pod watch sees it. The coordinator
queues the pods without ``spec.nodeName`` and counts the others on their nodes.

This split costs the API server one watch event per bind. A watch of our pending pods alone
(``spec.nodeName=,spec.schedulerName=<name>``) beside a watch of all bound pods gets two for the
same bind (the pending watch's DELETED when the pod leaves its selector, the bound watch's ADDED),
and on an API server that is the limit of a burst that second event per pod cost more of its CPU
than the bind itself gained (docs/kubernetes.md, Benchmark). Terminal pods leave either watch as
DELETED (a field selector's exit), so they free their node's resources.

The first list is served from the API server's watch cache (``resourceVersion=0``), a relist after
410 Gone is a consistent read, as client-go's Reflector does (`Reflector`).

A relist (after 410 Gone) diffs the new list against what the watch had (client-go's Replace):
ADDED/MODIFIED for new or changed objects, DELETED for the ones that disappeared, so consumers of
`Store.since` never need to relist themselves.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import urllib3

from shardsched.errors import PermanentError, TemporaryError
from shardsched.kube.client import Api, Garbage, classify, iter_lines, loads_json
from shardsched.cluster import ADDED, DELETED, MODIFIED, NAMESPACE, NODE, POD, Gone, WatchEvent, read_event_log

log = logging.getLogger(__name__)

NODES, BOUND, OURS, NAMESPACES = "nodes", "bound", "ours", "namespaces"
BOUND_WATCH = "pods-bound"
#: watch event types the store applies (BOOKMARK and ERROR are handled by the reflector)
_CHANGES = (ADDED, MODIFIED, DELETED)


@dataclass(frozen=True)
class WatchSpec:
    """One list+watch: its ``name``, object ``kind``, collection ``path``, server-side
    ``field_selector``, ``role`` (NODES, BOUND, OURS or NAMESPACES) and an optional server-side
    ``label_selector``."""

    name: str
    kind: str
    path: str
    field_selector: str
    role: str
    label_selector: str = ""

    @property
    def resource(self) -> str:
        """For messages: ``pods (spec.nodeName=,...)``."""
        base = self.path.rsplit("/", 1)[-1]
        return f"{base} ({self.field_selector})" if self.field_selector else base


def watch_specs(scheduler_names: Iterable[str]) -> list[WatchSpec]:
    """The watches of a scheduler serving ``scheduler_names``: nodes, namespaces (their labels,
    for pod affinity's ``namespaceSelector``), each name's pods, and the other pods bound to nodes
    (see module docstring)."""
    names = sorted(set(scheduler_names))
    live = "status.phase!=Succeeded,status.phase!=Failed"
    others = "".join(f",spec.schedulerName!={name}" for name in names)
    specs = [WatchSpec("nodes", NODE, "/api/v1/nodes", "", NODES),
             WatchSpec(NAMESPACES, NAMESPACE, "/api/v1/namespaces", "", NAMESPACES),
             WatchSpec(BOUND_WATCH, POD, "/api/v1/pods", f"spec.nodeName!=,{live}{others}", BOUND)]
    for name in names:
        specs.append(WatchSpec(f"pods-ours:{name}", POD, "/api/v1/pods", f"spec.schedulerName={name},{live}", OURS))
    return specs


def _key(obj: dict, kind: str) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    if kind != POD:
        return meta.get("name") or None
    return meta.get("uid") or (f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("name") else None)


def _rv(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Store:
    """Objects of every watch, merged (module docstring), and the log of changes.

    Args:
        specs: the watches feeding it.
        log_limit: changes kept for `since` (at least this many, at most 1/8 more); an older
            sequence number answers `Gone`.

    Thread-safe (one lock). Objects are the dicts from the API server; never modify them.
    """

    def __init__(self, specs: Iterable[WatchSpec], log_limit: int = 100_000) -> None:
        self.specs = {s.name: s for s in specs}
        self._members: dict[str, dict[str, dict]] = {name: {} for name in self.specs}
        self._pod_watches = [s.name for s in self.specs.values() if s.kind == POD]
        self._by_name: dict[str, dict] = {}  # "namespace/name" -> latest pod (any pod watch)
        self._lock = threading.Lock()
        self._log: list[WatchEvent] = []
        self._limit = log_limit
        self._slack = max(1, log_limit // 8)
        self._compacted = 0
        self._seq = 0
        self._pinned: tuple[list[dict], int] | None = None

    # ------------------------------------------------------------------ writes (reflectors)
    def apply(self, watch: str, type_: str, obj: dict) -> None:
        """Apply one watch event of watch ``watch`` (rules in the module docstring)."""
        with self._lock:
            self._apply(self.specs[watch], type_, obj)

    def replace(self, watch: str, items: list[dict]) -> int:
        """A fresh list of watch ``watch``: emit the differences (client-go's Replace). Returns how
        many changes were emitted."""
        spec = self.specs[watch]
        with self._lock:
            before = self._seq
            old = self._members[watch]
            new = {}
            for obj in items:
                k = _key(obj, spec.kind)
                if k is not None:
                    new[k] = obj
            for k, obj in new.items():
                prev = old.get(k)
                if prev is None:
                    self._apply(spec, ADDED, obj)
                elif _rv(prev) != _rv(obj):
                    self._apply(spec, MODIFIED, obj)
            for k in [k for k in old if k not in new]:
                self._apply(spec, DELETED, old[k])
            return self._seq - before

    def _apply(self, spec: WatchSpec, type_: str, obj: dict) -> None:
        k = _key(obj, spec.kind)
        if k is None:
            return
        mine = self._members[spec.name]
        if type_ == DELETED:
            if mine.pop(k, None) is None:
                return  # never seen (or already gone): nothing to tell
        else:
            mine[k] = obj
        if spec.kind == POD:
            meta = obj.get("metadata") or {}
            name_key = f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
            if type_ == DELETED:
                if (self._by_name.get(name_key) or {}).get("metadata", {}).get("uid") == meta.get("uid"):
                    self._by_name.pop(name_key, None)
            else:
                self._by_name[name_key] = obj
        self._seq += 1
        self._log.append(WatchEvent(type_, spec.kind, obj, self._seq))
        if len(self._log) > self._limit + self._slack:
            drop = len(self._log) - self._limit
            self._compacted = self._log[drop - 1].rv
            del self._log[:drop]

    # ------------------------------------------------------------------ reads (the protocol)
    def _pods(self) -> list[dict]:
        return [obj for name in self._pod_watches for obj in self._members[name].values()]

    def list_nodes(self) -> tuple[list[dict], int]:
        """All nodes and the sequence number to call `since` with. Pins the pods of the same moment
        for the next `list_pods`, so a relist that reads nodes then pods sees one point in time."""
        with self._lock:
            self._pinned = (self._pods(), self._seq)
            return list(self._members["nodes"].values()), self._seq

    def list_pods(self) -> tuple[list[dict], int]:
        """Every pod we know (our pending pods, and the non-terminal bound pods of anyone) and the
        sequence number; the snapshot pinned by `list_nodes` when there is one."""
        with self._lock:
            pinned, self._pinned = self._pinned, None
            return pinned if pinned is not None else (self._pods(), self._seq)

    def list_namespaces(self) -> tuple[list[dict], int]:
        """All Namespace objects and the sequence number ([] without a namespace watch)."""
        with self._lock:
            return list(self._members.get(NAMESPACES, {}).values()), self._seq

    def pod(self, namespace: str, name: str) -> dict | None:
        """The latest state of a pod we watch, or None."""
        with self._lock:
            return self._by_name.get(f"{namespace}/{name}")

    def since(self, rv: int | str, kinds: Iterable[str] | None = None,
              limit: int | None = None) -> tuple[list[WatchEvent], int]:
        """Changes after sequence number ``rv``, oldest first (the simulated cluster's
        ``events_since`` contract).

        Returns: (events, new_rv). Raises: `Gone` (``rv`` compacted away, or from another
        instance: list again), `Invalid` (``rv`` not an integer, ``limit`` < 1).
        """
        with self._lock:
            return read_event_log(self._log, self._compacted, self._seq, rv, kinds, limit, "informer")

    def counts(self) -> dict[str, int]:
        """Objects per watch (for health and metrics)."""
        with self._lock:
            return {name: len(m) for name, m in self._members.items()}


class Backoff:
    """Exponential backoff with jitter: ``base_s`` doubling to ``cap_s``, times uniform(0.8, 1.2)."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 30.0) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.failures = 0

    def next_s(self) -> float:
        delay = min(self.cap_s, self.base_s * 2 ** self.failures)
        self.failures += 1
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.failures = 0


@dataclass
class ReflectorStats:
    """Counters of one reflector (plain, for health and metrics)."""

    synced: bool = False
    lists: int = 0
    relists: int = 0
    watches: int = 0
    events: int = 0
    garbage: int = 0
    errors: int = 0
    last_error: str = ""
    last_error_permanent: bool = False  # the newest error is a PermanentError and no watch opened since
    failing: bool = False  # the newest attempt failed and no list or watch has succeeded since
    rv: str = ""
    history: list[str] = field(default_factory=list)  # last few error lines, newest last


def list_all(api: Any, path: str, resource: str, query: list[tuple[str, str]], page_size: int = 500,
             first: list[tuple[str, str]] | tuple = (), name: str = "") -> tuple[list[dict], str, int]:
    """Every object of a list, read in pages of ``page_size`` (``limit``/``continue``; 0 = one
    answer). ``first``: parameters of the first page only (a continued page carries no
    resourceVersion). A continuation that expired (410) lists again from the start.

    Returns: (objects with a ``metadata`` mapping, the list's resourceVersion, how many items were
        not objects and were skipped).
    Raises: the typed errors of `Api.request`; `Garbage` for an answer that is not a list or a
        list without ``metadata.resourceVersion``.
    """
    items: list[dict] = []
    garbage = 0
    cont = ""
    while True:
        page_query = list(query) + ([("limit", str(page_size))] if page_size else [])
        page_query += [("continue", cont)] if cont else list(first)
        try:
            page = api.request("GET", path, verb="list", resource=resource, query=page_query)
        except Gone:
            if not cont:
                raise
            log.info("%s: list continuation expired; listing again from the start", name or resource)
            items, garbage, cont = [], 0, ""
            continue
        if not isinstance(page, dict) or not isinstance(page.get("items", []), list):
            raise Garbage(f"list {resource}: the answer is not a list: {str(page)[:120]}")
        meta = page.get("metadata") or {}
        for obj in page.get("items") or []:
            if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
                items.append(obj)
            else:
                garbage += 1
        cont = meta.get("continue") or ""
        if not cont:
            rv = meta.get("resourceVersion")
            if not rv:
                raise Garbage(f"list {resource}: the answer has no metadata.resourceVersion")
            return items, rv, garbage


def shutdown_socket(sock: Any) -> None:
    """Shut a connection's socket down (both ways) from another thread than its reader's, so that
    the reader sees the end of the stream. For a TLS socket the TCP socket underneath is shut down:
    ``SSLSocket.shutdown`` also drops its TLS state, and a read racing it then returns the raw TLS
    records as if they were the stream's bytes (seen as "not a watch event" lines holding binary).
    None or a closed socket: nothing to do."""
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except (OSError, TypeError, ValueError):
        pass


class Reflector:
    """List, then watch from the list's resourceVersion, for one `WatchSpec` (client-go's
    Reflector): relist on 410 Gone, reconnect with backoff on connection loss or errors (resuming
    from the last resourceVersion seen, bookmarks included), log garbage and go on.

    Args:
        api: the connection. store: where objects go. spec: what to watch.
        watch_timeout_s: server-side ``timeoutSeconds`` of one watch call (randomized up to 2x, as
            client-go does, so that many clients do not reconnect in step).
        page_size: list page size (``limit``/``continue``); 0 = unpaged.
        read_slack_s: client read timeout = watch timeout + this (a dead connection is noticed).

    Which list, as client-go's Reflector: the first one asks for ``resourceVersion=0``, which the
    API server answers from its watch cache (all items in one answer; it ignores ``limit``)
    instead of reading every object from etcd, so a scheduler (re)starting on a large cluster
    does not load the control plane with a full quorum read; the watch then resumes from the
    cache's resourceVersion, so nothing later is missed. After a 410 Gone the relist is a
    consistent read (no resourceVersion, paged): the watch fell too far behind, and the cache may
    be too.
    """

    def __init__(self, api: Api, store: Store, spec: WatchSpec, watch_timeout_s: float = 300.0,
                 page_size: int = 500, read_slack_s: float = 30.0) -> None:
        self.api = api
        self.store = store
        self.spec = spec
        self.watch_timeout_s = watch_timeout_s
        self.page_size = page_size
        self.read_slack_s = read_slack_s
        self.stats = ReflectorStats()
        self.rv: str | None = None
        #: the next list is a consistent read (after a 410 Gone); else from the watch cache
        self.consistent_list = False
        self._stop = threading.Event()
        self._resp = None
        self._thread: threading.Thread | None = None

    def _query(self) -> list[tuple[str, str]]:
        query = [("fieldSelector", self.spec.field_selector)] if self.spec.field_selector else []
        return query + [("labelSelector", self.spec.label_selector)] if self.spec.label_selector else query

    def list(self) -> str:
        """List everything (paged) into the store; returns the list's resourceVersion. From the
        API server's watch cache (``resourceVersion=0``) unless `consistent_list` is set (class
        docstring).

        Raises: the typed errors of `Api.request`; `Garbage` for a list without items or
        resourceVersion.
        """
        first = [] if self.consistent_list else [("resourceVersion", "0")]
        items, rv, garbage = list_all(self.api, self.spec.path, self.spec.resource, self._query(), self.page_size,
                                      first, self.spec.name)
        self.stats.garbage += garbage
        for obj in items:
            obj.setdefault("kind", self.spec.kind)
            obj.setdefault("apiVersion", "v1")
        self.store.replace(self.spec.name, items)
        self.consistent_list = False
        self.stats.lists += 1
        self.stats.synced = True
        self.stats.last_error_permanent = self.stats.failing = False
        self.rv = self.stats.rv = str(rv)
        return self.rv

    def watch_once(self) -> int:
        """One watch call from `rv` until the server ends it (timeout) or the connection breaks.
        Returns the number of changes applied.

        Raises: `Gone` (410: relist), `Garbage` (a line that is not a watch event: reconnect), the
        typed errors of `Api.stream`.
        """
        timeout_s = int(self.watch_timeout_s * random.uniform(1.0, 2.0))
        query = self._query() + [("watch", "true"), ("resourceVersion", self.rv or "0"),
                                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(max(1, timeout_s)))]
        resp = self.api.stream(self.spec.path, verb="watch", resource=self.spec.resource, query=query,
                               timeout_s=(self.api.timeout_s[0], timeout_s + self.read_slack_s))
        self._resp = resp
        self.stats.watches += 1
        # the server answered 200: whatever was refusing us (RBAC, credentials) no longer is, so
        # health stops reporting it (it stays in `history`)
        self.stats.last_error_permanent = self.stats.failing = False
        applied = 0
        read_to_end = False
        try:
            if self._stop.is_set():  # stopped while connecting
                return 0
            for line in iter_lines(resp):
                try:
                    event = loads_json(line)
                    type_, obj = event["type"], event["object"]
                    if not isinstance(obj, dict):
                        raise TypeError("object is not a mapping")
                except (ValueError, KeyError, TypeError) as e:
                    self.stats.garbage += 1
                    raise Garbage(f"watch {self.spec.resource}: not a watch event ({e}): {line[:120]!r}") from None
                if type_ == "ERROR":
                    code = obj.get("code")
                    raise (Gone(f"watch {self.spec.resource}: {obj.get('message', 'expired')}") if code == 410
                           else classify(int(code or 500), json.dumps(obj), "watch", self.spec.resource))
                new_rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj.get("metadata"), dict) else None
                if type_ == "BOOKMARK":
                    if new_rv:
                        self.rv = self.stats.rv = str(new_rv)
                    continue
                if type_ not in _CHANGES or not new_rv:
                    self.stats.garbage += 1
                    log.warning("%s: ignoring a watch event without %s: %.120s", self.spec.name,
                                "a known type" if type_ not in _CHANGES else "metadata.resourceVersion", line)
                    continue
                obj.setdefault("kind", self.spec.kind)
                obj.setdefault("apiVersion", "v1")
                self.store.apply(self.spec.name, type_, obj)
                applied += 1
                self.stats.events += 1
                self.rv = self.stats.rv = str(new_rv)
            read_to_end = True
        except (urllib3.exceptions.HTTPError, OSError) as e:
            if not self._stop.is_set():
                log.info("%s: watch connection lost (%s); resuming from resourceVersion %s", self.spec.name,
                         type(e).__name__, self.rv)
        finally:
            self._resp = None
            try:
                if not read_to_end:
                    # left mid-stream (an ERROR event, a bad line, a stop): the rest of the stream
                    # must not be read as the start of the next answer on this pooled connection
                    resp.close()
                resp.release_conn()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        return applied

    def run(self) -> None:
        """The loop (in its own thread): watch, relist on Gone, back off on errors; never dies."""
        backoff = Backoff()
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if self.rv is None:
                    self.list()
                    self.stats.relists += 1
                applied = self.watch_once()
                if applied or time.monotonic() - started > 10:
                    backoff.reset()
                    continue
                delay = backoff.next_s() if time.monotonic() - started < 1 else 0.0
            except Gone as e:
                log.info("%s: %s; relisting", self.spec.name, e)
                self.rv = None
                self.consistent_list = True
                continue
            except (PermanentError, TemporaryError) as e:
                delay = backoff.next_s()
                self._record(e, delay)
            except Exception as e:  # noqa: BLE001 - the informer must never die
                delay = backoff.next_s()
                self._record(e, delay)
            if delay:
                self._stop.wait(delay)

    def _record(self, e: Exception, delay: float) -> None:
        self.stats.errors += 1
        self.stats.failing = True
        self.stats.last_error = f"{type(e).__name__}: {e}"
        self.stats.last_error_permanent = isinstance(e, PermanentError)
        self.stats.history = (self.stats.history + [self.stats.last_error])[-5:]
        level = logging.ERROR if isinstance(e, PermanentError) else logging.WARNING
        log.log(level, "%s: %s; retrying in %.1f s", self.spec.name, self.stats.last_error, delay)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"reflector-{self.spec.name}", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Break the current watch connection (it resumes from the last resourceVersion)."""
        resp = self._resp
        if resp is None:
            return
        shutdown_socket(getattr(getattr(resp, "connection", None), "sock", None))

    def stop(self) -> None:
        self._stop.set()
        self.cut()
        if self._thread is not None:
            self._thread.join(timeout=5)
