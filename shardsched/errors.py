"""The one small exception hierarchy of shardsched, and `ThrottledLog` for failures that repeat.

Expected scheduling outcomes (a pod does not fit, a node is taken) are values (`framework.Status`),
never exceptions. Exceptions are for bad input, bugs and infrastructure faults; their type, not their
message, decides what the caller does (retry later, give up on one object, stop a shard).
"""

from __future__ import annotations

import threading
import time


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


class FencedOffError(PermanentError):
    """This shard's fencing token or shard-map epoch is stale: another owner took over."""


class ThrottledLog:
    """Log a repeated failure at most once per ``every_s`` with how many happened since the last
    line (the first one is logged at once): a Redis or an API server that is away for a minute
    then prints a handful of lines, not one per pod or per Event. Thread-safe.

    ``record(logger, level, template, last)`` formats ``template`` with ``count`` (failures since
    the last line, this one included) and ``last`` (this failure's text, cut at 300 characters).
    A count not yet logged when failures stop is not logged (the callers also count failures).
    """

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._logged_at = float("-inf")
        self._unlogged = 0

    def record(self, logger, level: int, template: str, last: str) -> None:
        with self._lock:
            self._unlogged += 1
            now = time.monotonic()
            if now - self._logged_at < self.every_s:
                return
            count, self._unlogged, self._logged_at = self._unlogged, 0, now
        logger.log(level, template.format(count=count, last=last[:300]))
