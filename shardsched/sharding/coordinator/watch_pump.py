"""The watch pump: the coordinator's long poll of the cluster's watch, in a thread of its own.

A pod that arrives alone must be routed at once, not at the coordinator's next poll. The pump
calls ``events_since(rv, ..., wait_s=WATCH_WAIT_S)`` (a long poll: the cluster answers as soon as a
change comes, `shardsched.cluster.watch.wait_for_events`), holds the answer (`WatchAnswer`) for
the loop and wakes it (`Coordinator.wake`); the loop applies it under the state lock as it applied
its own polls (`Intake.poll`), then the pump asks again from the new rv. So:

- the pump holds no lock while it waits: not the state lock (the health check, a shard's
  replacement, the hand-offs, the scale steps and the status calls take it meanwhile), not the
  cluster's (the wait releases it; the binds and the creations go on), and not the loop: the loop
  waits on its own wake-up (`threading.Event`), which the pump, a shard's hand-off and `stop` set,
  and at most `Coordinator.poll_s` in any case (what is due by time: gangs, the limbo sweep, the
  autoscaler);
- an answer is applied only from the rv it was asked from (`WatchAnswer.rv_from`): after a relist
  (410 Gone) or a `Coordinator.catch_up` that polled meanwhile, a stale answer is dropped and the
  pump asks again from the coordinator's rv;
- the pump waits for the loop to take one answer before it asks for the next, so a burst is taken
  in chunks of `WATCH_BATCH` as the loop gets through them (the batches grow only while events
  queue), and a cluster that does not answer is asked again after `RETRY_S` (its error goes to
  the loop, which records it as its own poll did).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from shardsched.sharding.coordinator.state import CoordinatorState

log = logging.getLogger(__name__)

#: seconds one long poll waits for a change before the pump asks again (the cluster answers at once
#: when one comes); also how long a stopped pump may take to notice it
WATCH_WAIT_S = 0.5
#: seconds the pump waits after the cluster did not answer (or answered an error) before asking again
RETRY_S = 0.1
#: extra seconds the pump's call waits for the answer beyond the long poll (the cluster's own delay)
ANSWER_MARGIN_S = 30.0
#: watch events taken per poll: enough to amortize the call, few enough that decoding a burst's
#: events does not balloon the coordinator's memory (a Python heap rarely shrinks back)
WATCH_BATCH = 4000


@dataclass
class WatchAnswer:
    """One answer of the cluster's watch: the events after ``rv_from`` and the rv to ask from next,
    or the error the call raised (`result` raises it again)."""

    rv_from: int | str
    events: list = field(default_factory=list)
    rv: int | str = 0
    error: BaseException | None = None

    def result(self) -> tuple[list, int | str]:
        """(events, rv); raises the call's error (`Gone`, `RemoteUnavailable`, ...)."""
        if self.error is not None:
            raise self.error
        return self.events, self.rv


def fetch(state: CoordinatorState, wait_s: float | None = None) -> WatchAnswer:
    """Ask the cluster for the events after the coordinator's rv (at most `WATCH_BATCH`), waiting
    up to ``wait_s`` for the first; any error is kept in the answer."""
    rv = state.rv
    try:
        reply = state.cluster.events_since(rv, None, WATCH_BATCH, wait_s)
        events, new_rv = reply.wait((wait_s or 0.0) + ANSWER_MARGIN_S)
    except Exception as e:  # noqa: BLE001 - the loop decides what an error means (relist, last_error)
        return WatchAnswer(rv, error=e)
    return WatchAnswer(rv, events, new_rv)


class WatchPump:
    """Long-polls the watch in a thread (`start`) and holds each answer for the loop (`take`).

    Args:
        state: the coordinator's state (its cluster client and rv).
        wake: called when an answer is there (the loop's wake-up).
        wait_s: seconds each long poll waits for a change.
    """

    def __init__(self, state: CoordinatorState, wake: Any, wait_s: float = WATCH_WAIT_S) -> None:
        self.state = state
        self.wake = wake
        self.wait_s = wait_s
        self._answer: WatchAnswer | None = None
        self._lock = threading.Lock()
        self._taken = threading.Event()
        self._taken.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="coordinator-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """The thread ends after its current long poll (`WATCH_WAIT_S` at most)."""
        self._stop.set()
        self._taken.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._stop.is_set()

    def take(self) -> WatchAnswer | None:
        """The answer the pump holds (once), or None; call `resume` once it is applied (the
        coordinator's rv moved on), so that the pump asks for the next from there."""
        with self._lock:
            answer, self._answer = self._answer, None
        return answer

    def resume(self) -> None:
        """The answer taken is applied: ask for the next."""
        self._taken.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            # one answer at a time: the next is asked from the rv the loop set when it applied this one
            while not self._taken.wait(self.wait_s):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            answer = fetch(self.state, self.wait_s)
            if answer.error is None and not answer.events and answer.rv == answer.rv_from:
                continue  # nothing changed within the wait: ask again
            with self._lock:
                self._taken.clear()
                self._answer = answer
            self.wake()
            if answer.error is not None:
                log.debug("watch: %s", answer.error)
                self._stop.wait(RETRY_S)
