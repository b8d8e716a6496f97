"""The bind half of the cluster contract: `Binding` (one request of ``bind_many``) and `BindResult`
(its answer, one per item, never an exception for one item), as the ``pods/binding`` subresource."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

from shardsched.cluster.errors import ApiError, Conflict, NotFound, ServerError, Timeout

#: `BindResult.code` values as a shard reads them: bound; the pod (or node) is gone or the uid
#: differs; the pod is already bound; not applied (5xx, 429, no connection): retry; timed out: the
#: bind may or may not have been applied (the watch tells)
BOUND, NOT_FOUND, CONFLICT, NOT_APPLIED, MAYBE_APPLIED = 201, 404, 409, 500, 504


class Binding(NamedTuple):
    """One bind request for ``bind_many``; a plain ``(namespace, name, node_name)`` or
    ``(namespace, name, node_name, uid)`` tuple works the same. ``uid``, when set, must be the
    current pod's uid (a precondition, as ``Binding.metadata.uid``). ``annotations`` are set on the
    pod with the binding (``Binding.metadata.annotations``, which the API server copies onto the
    pod in the same update that sets ``spec.nodeName``): the GPU devices chosen for it."""

    namespace: str
    name: str
    node_name: str
    uid: str | None = None
    annotations: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class BindResult:
    """Outcome of one bind.

    Attributes:
        code: 201 bound; 404 pod or node not found (or uid differs); 409 pod already bound;
            500 server error; 504 timeout (the bind may or may not have been applied).
        reason: for an error, its Kubernetes status reason (``NotFound``, ``Conflict``,
            ``InternalError``, ``Timeout``); for a bind the admission rejected, the pod's
            ``status.reason`` (``OutOfcpu``, ``OutOfpods``, ``OutOfnvidia.com/gpu``, ...); else "".
        message: the error's or the admission rejection's message; else "".
        phase: pod phase right after a successful bind: ``Running``, or ``Failed`` when the
            kubelet-like admission rejected it; "" on errors.
    """

    namespace: str
    name: str
    node_name: str
    code: int
    reason: str = ""
    message: str = ""
    phase: str = ""

    @property
    def ok(self) -> bool:
        """True when the pod was bound (even if the admission then failed it)."""
        return self.code == BOUND

    def error(self) -> ApiError | None:
        """The typed error this result stands for (`NotFound`, `Conflict`, `ServerError`,
        `Timeout`), or None when ``ok``."""
        if self.ok:
            return None
        return _BIND_ERRORS[self.code](self.message)


_BIND_ERRORS: dict[int, type[ApiError]] = {NOT_FOUND: NotFound, CONFLICT: Conflict, NOT_APPLIED: ServerError,
                                           MAYBE_APPLIED: Timeout}
