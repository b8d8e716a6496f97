"""Clocks for the scheduling queue: one protocol, a real monotonic clock, and a fake for tests.

Upstream's PriorityQueue takes a ``clock.Clock`` (``WithClock``) for the same reason: backoff and the
unschedulable-pods timeout are pure functions of time, so tests advance a fake clock instead of
sleeping. All values are seconds on a monotonic scale, not wall-clock time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now() -> float`` (seconds, monotonic)."""

    def now(self) -> float: ...


class RealClock:
    """``time.monotonic()``: seconds since an arbitrary point, never goes backwards."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to, for tests.

    Args:
        start_s: the initial reading, seconds.
    """

    __slots__ = ("_now",)

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = float(start_s)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``.

        Raises:
            ValueError: ``seconds`` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError(f"cannot move a monotonic clock back by {seconds} s")
        self._now += seconds
