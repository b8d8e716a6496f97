"""Typed API errors of the simulated cluster, one class per Kubernetes status the sim serves.

Callers decide by type, never by message (as Kopf does): the 5xx and timeout errors are
`TemporaryError` (retry after ``delay_s``), the 4xx errors are `PermanentError` (retrying the same
request cannot succeed). Each class carries the HTTP ``code`` and the Kubernetes ``reason``
(``metav1.StatusReason``) the real API server would answer with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from shardsched.errors import PermanentError, ShardschedError, TemporaryError


class ApiError(ShardschedError):
    """Base of the errors the simulated API answers with; ``code`` and ``reason`` as in a
    ``metav1.Status``."""

    code: ClassVar[int] = 0
    reason: ClassVar[str] = ""


class NotFound(ApiError, PermanentError):
    """404: the pod or node does not exist (or the pod was deleted and re-created with a new uid)."""

    code = 404
    reason = "NotFound"


class Conflict(ApiError, PermanentError):
    """409: the pod is already bound to a node (``pods/binding`` on an assigned pod)."""

    code = 409
    reason = "Conflict"


class AlreadyExists(ApiError, PermanentError):
    """409: create of an object whose name is taken."""

    code = 409
    reason = "AlreadyExists"


class Gone(ApiError, PermanentError):
    """410: the watch history no longer reaches back to the requested resourceVersion (it was
    compacted); the caller must list again and watch from the list's resourceVersion."""

    code = 410
    reason = "Expired"


class Invalid(ApiError, PermanentError):
    """422: the object failed validation; the message names the field path."""

    code = 422
    reason = "Invalid"


class ServerError(ApiError, TemporaryError):
    """500: the server failed to process the request; nothing was applied."""

    code = 500
    reason = "InternalError"


class Timeout(ApiError, TemporaryError):
    """504: no answer in time. The request may or may not have been applied (as with a real API
    server); the caller learns the outcome from the watch or by retrying."""

    code = 504
    reason = "Timeout"


class TraceError(ShardschedError):
    """A trace file cannot be read at all: it is missing, unreadable, or its header lacks
    required columns. (Malformed rows are skipped and reported instead, see `sim.trace`.)"""


def read_event_log(log: Sequence, compacted_rv: int, current_rv: int, rv: int | str,
                   kinds: Iterable[str] | None, limit: int | None, owner: str) -> tuple[list, int]:
    """The ``events_since`` contract over a contiguous event log, shared by the simulated cluster and
    the kube informer: ``log[i].rv == compacted_rv + 1 + i``. Call with the owner's lock held.

    Returns:
        (events after ``rv``, oldest first, filtered by ``kinds`` and cut at ``limit``; the rv to
        pass next: ``current_rv``, or the last returned event's when ``limit`` cut the answer).

    Raises:
        Invalid: ``rv`` is not an integer, or ``limit`` < 1.
        Gone: ``rv`` was compacted away, or is newer than ``current_rv`` (it came from another
            instance, named by ``owner`` in the message): list again.
    """
    try:
        rv = int(rv)
    except (TypeError, ValueError):
        raise Invalid(f"resourceVersion: {rv!r} is not a valid resource version") from None
    if limit is not None and limit < 1:
        raise Invalid(f"limit: {limit} must be >= 1")
    if rv < compacted_rv:
        raise Gone(f"too old resource version: {rv} (oldest available: {compacted_rv})")
    if rv > current_rv:
        raise Gone(f"resource version {rv} is newer than this {owner}'s ({current_rv})")
    tail = log[rv - compacted_rv:]
    if kinds is not None:
        wanted = frozenset(kinds)
        tail = [ev for ev in tail if ev.kind in wanted]
    if limit is not None and len(tail) > limit:
        return tail[:limit], tail[limit - 1].rv
    return tail, current_rv
