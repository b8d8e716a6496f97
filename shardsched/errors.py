"""The one small exception hierarchy of shardsched.

Expected scheduling outcomes (a pod does not fit, a node is taken) are values (`framework.Status`),
never exceptions. Exceptions are for bad input, bugs and infrastructure faults; their type, not their
message, decides what the caller does (retry later, give up on one object, stop a shard).
"""

from __future__ import annotations


class ShardschedError(Exception):
    """Base of every error shardsched raises on purpose."""


class InvalidObjectError(ShardschedError):
    """A Kubernetes object (or a field of it) cannot be understood.

    Attributes:
        path: dotted field path inside the object, e.g. ``spec.containers[0].resources.requests.cpu``.
        where: where the object came from (``file.yaml#3``, ``default/web``), filled in by callers.
    """

    def __init__(self, message: str, path: str = "", where: str = "") -> None:
        self.message = message
        self.path = path
        self.where = where
        super().__init__(self.__str__())

    def located(self, where: str) -> "InvalidObjectError":
        """Return a copy that also says where the object came from."""
        return InvalidObjectError(self.message, self.path, where)

    def __str__(self) -> str:
        parts = [p for p in (self.where, self.path) if p]
        prefix = ": ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message


class ConfigError(ShardschedError):
    """A scheduler configuration file is invalid; the message names the field path."""


class TemporaryError(ShardschedError):
    """A fault that may go away (Redis or the API unreachable, a 5xx); retry after ``delay_s``."""

    def __init__(self, message: str, delay_s: float = 1.0) -> None:
        self.delay_s = delay_s
        super().__init__(message)


class PermanentError(ShardschedError):
    """A fault that retrying will not fix (RBAC denied, invalid object rejected by the server)."""


class LeaseLostError(TemporaryError):
    """This shard no longer holds the lease of a pod (it expired or was taken over)."""


class FencedOffError(PermanentError):
    """This shard's fencing token or shard-map epoch is stale: another owner took over."""
