"""Typed API errors of a cluster backend, one class per Kubernetes status a backend answers with.

Both backends raise them: the simulated cluster (`shardsched.sim`) as its API server would, the
Kubernetes backend (`shardsched.kube`) from the status of the real API server's answer.

Callers decide by type, never by message (as Kopf does): the 5xx and timeout errors are
`TemporaryError` (retry after ``delay_s``), the 4xx errors are `PermanentError` (retrying the same
request cannot succeed). Each class carries the HTTP ``code`` and the Kubernetes ``reason``
(``metav1.StatusReason``) the real API server would answer with.
"""

from __future__ import annotations

from typing import ClassVar

from shardsched.errors import PermanentError, ShardschedError, TemporaryError


class ApiError(ShardschedError):
    """Base of the errors a cluster backend answers with; ``code`` and ``reason`` as in a
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


class Forbidden(ApiError, PermanentError):
    """403: RBAC denies the request (the message names the verb and the resource); retrying cannot
    succeed until the role grants it."""

    code = 403
    reason = "Forbidden"


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
