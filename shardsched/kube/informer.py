"""Informers: list, then watch from the list's resourceVersion, relist on 410, reconnect with backoff.

One `Reflector` thread per watch (client-go's Reflector) feeds one `shardsched.kube.watches.Store`
(client-go's informer store plus a bounded event log), which serves the cluster contract the
coordinator consumes; the watches themselves, and why pods come from two of them, are in
`shardsched.kube.watches`.

The first list is served from the API server's watch cache (``resourceVersion=0``), a relist after
410 Gone is a consistent read, as client-go's Reflector does (`Reflector`).

A relist (after 410 Gone) hands the new list to `Store.replace`, which diffs it against what the
watch had (client-go's Replace).
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import urllib3

from shardsched.errors import PermanentError, TemporaryError
from shardsched.kube.client import Api, Garbage, classify, iter_lines, loads_json
from shardsched.kube.watches import CHANGES, Store, WatchSpec
from shardsched.cluster import Gone

log = logging.getLogger(__name__)

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
            obj.setdefault("apiVersion", self.spec.api_version)
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
                if type_ not in CHANGES or not new_rv:
                    self.stats.garbage += 1
                    log.warning("%s: ignoring a watch event without %s: %.120s", self.spec.name,
                                "a known type" if type_ not in CHANGES else "metadata.resourceVersion", line)
                    continue
                obj.setdefault("kind", self.spec.kind)
                obj.setdefault("apiVersion", self.spec.api_version)
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
