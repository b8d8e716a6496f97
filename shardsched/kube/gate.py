"""`BindsFirst`: the gate that holds a process's Event and condition writes back while binds are in
flight (here or, through ``peers``, in the other processes of the scheduler), so that in a burst
the API server spends itself on placing pods first. It is the Kubernetes backend's
`shardsched.cluster.WriteGate`; the writers of `shardsched.kube.writers` pass through it."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

#: Event and condition writes in flight at once while the same process binds (`BindsFirst`)
WRITES_WHILE_BINDING = 1
#: for how long from a burst's start no Event or condition write goes out (then one at a time,
#: `WRITES_WHILE_BINDING`): a burst shorter than this binds with no write beside it
HOLD_FOR_BURST_S = 10.0
#: a bind call of at least this many pods is a burst: it fills every request slot of a binding
#: cycle (`KubeCluster`'s ``bind_workers``, whose value it takes there), so the API server, not
#: the call, sets its pace
BURST_PODS = 32
#: a peer still bursting when `BindsFirst` has not asked for this long counts as a new burst
PEER_BURST_GAP_S = 1.0
#: after a process's last bind returns, how long its writers still count it as binding: a shard's
#: binding cycles follow each other with a few milliseconds between them
BIND_LINGER_S = 0.05


class BindsFirst:
    """Binds before Events and conditions.

    kube-scheduler writes its Events through a client of their own, with their own rate limit
    (``clientConnection.qps``, 50/s) and a bounded queue that drops when full, so in a burst its
    binds get the API server. shardsched writes every Event (nothing dropped while fewer than
    10,000 wait) and orders the writes behind the binds, at three levels:

    - no bind in flight in this process (none returned within ``linger_s``) and none in another
      process of the scheduler (``peers``): writes go out side by side (the writers' width);
    - binds in flight: at most ``while_binding`` writes at once;
    - a burst in flight (a bind call of at least ``burst_pods`` pods, here or in a peer): no
      write goes out during the burst's first ``hold_s`` seconds, then ``while_binding`` at a
      time. A burst here starts with its first call (calls less than ``linger_s`` apart are one
      burst); a peer's, when this gate first hears of it (a peer still bursting when the gate
      has not asked for a second starts a new one).

    A pod waits on its bind, not on its Event. On an API server that a burst of binds already
    keeps busy, an Event costs it more CPU than a bind (1.2-4x in sampled runs), so Events written
    in the middle of the burst slow its binds down (docs/kubernetes.md, Benchmark). A burst shorter than ``hold_s`` therefore
    binds with no write beside it; in a longer one the writes still make progress, and all go out
    at full width once the binds end. Small bind calls (a steady trickle of pods) hold nothing
    for longer than one write at a time, so their Events are not delayed.

    ``binding(pods)`` wraps a bind call; ``writing()`` wraps one write (blocks while the gate is
    shut). ``peers`` (set after construction, e.g. by a shard in Ray mode, where each shard binds
    from a process of its own): a callable answering `IDLE`, `BINDING` or `BURST` for the other
    processes (from `shardsched.store.ledger.Ledger.binding_marks`), asked at most every
    ``PEER_POLL_S``; when it raises (Redis away), the answer is `IDLE`: the gate only orders the
    writes, it never holds them back on an error.

    Raises ``ValueError`` for ``while_binding`` < 1, a negative ``hold_s`` or ``burst_pods`` < 1.
    """

    #: levels of `level` and of ``peers``' answer
    IDLE, BINDING, BURST = 0, 1, 2
    #: seconds between two questions to ``peers`` (the answer is reused meanwhile)
    PEER_POLL_S = 0.05

    def __init__(self, while_binding: int = WRITES_WHILE_BINDING, linger_s: float = BIND_LINGER_S,
                 hold_s: float = HOLD_FOR_BURST_S, burst_pods: int = BURST_PODS) -> None:
        if while_binding < 1:
            raise ValueError("while_binding: at least 1, or the Events of a steady stream of binds never go out")
        if hold_s < 0:
            raise ValueError(f"hold_s: seconds, at least 0 (got {hold_s})")
        if burst_pods < 1:
            raise ValueError(f"burst_pods: at least 1 (got {burst_pods})")
        self.while_binding = while_binding
        self.linger_s = linger_s
        self.hold_s = hold_s
        self.burst_pods = burst_pods
        self.peers: Callable[[], int] | None = None
        self._cond = threading.Condition()
        self._binding = 0
        self._bursts = 0
        self._writing = 0
        self._bind_ended = float("-inf")  # monotonic time the last bind call returned
        self._burst_ended = float("-inf")  # ... the last burst call
        self._burst_since = float("-inf")  # monotonic time this process's burst began
        self._peer_lock = threading.Lock()
        self._peer_level = self.IDLE
        self._peer_asked = float("-inf")
        self._peer_burst_since = float("-inf")  # when the peers' burst was first heard of
        self.waits = 0  # writes that had to wait for the binds (a figure for tests and /metrics)

    def is_burst(self, pods: int) -> bool:
        """Whether a bind call of ``pods`` pods is a burst (``burst_pods`` or more)."""
        return pods >= self.burst_pods

    @contextmanager
    def binding(self, pods: int = 1) -> Iterator[None]:
        """Wrap a bind call of ``pods`` pods (a burst: `is_burst`)."""
        burst = self.is_burst(pods)
        with self._cond:
            self._binding += 1
            if burst:
                now = time.monotonic()
                if self._bursts == 0 and now - self._burst_ended >= self.linger_s:
                    self._burst_since = now  # a new burst, not the next call of the same one
                self._bursts += 1
        try:
            yield
        finally:
            with self._cond:
                self._binding -= 1
                self._bursts -= burst
                self._bind_ended = time.monotonic()
                if burst:
                    self._burst_ended = self._bind_ended
                self._cond.notify_all()

    def level(self) -> int:
        """This process's own level (the peers are not asked): `BURST` while a burst call is in
        flight or the last ended less than ``linger_s`` ago, else `BINDING` likewise for any bind
        call, else `IDLE`."""
        with self._cond:
            return self._level_locked(time.monotonic())

    def _level_locked(self, now: float) -> int:
        if self._bursts > 0 or now - self._burst_ended < self.linger_s:
            return self.BURST
        if self._binding > 0 or now - self._bind_ended < self.linger_s:
            return self.BINDING
        return self.IDLE

    def busy(self) -> bool:
        """Binds in flight in this process, or the last returned less than ``linger_s`` ago (the
        peers are not asked)."""
        return self.level() > self.IDLE

    def _peers_level(self) -> int:
        """``peers()``, asked at most every `PEER_POLL_S` (never under ``_cond``: a slow answer
        must not hold up a bind call entering `binding`)."""
        peers = self.peers
        if peers is None:
            return self.IDLE
        with self._peer_lock:
            now = time.monotonic()
            if now - self._peer_asked >= self.PEER_POLL_S:
                before, stale = self._peer_level, now - self._peer_asked > PEER_BURST_GAP_S
                try:
                    self._peer_level = min(max(int(peers()), self.IDLE), self.BURST)
                except Exception:  # noqa: BLE001 - an ordering hint, never a reason to hold writes
                    self._peer_level = self.IDLE
                self._peer_asked = time.monotonic()
                if self._peer_level == self.BURST and (before != self.BURST or stale):
                    self._peer_burst_since = self._peer_asked
            return self._peer_level

    @contextmanager
    def writing(self) -> Iterator[None]:
        waited = False
        while True:
            with self._cond:
                local = self._level_locked(time.monotonic())
            # the peers are asked outside the lock (`_peers_level`), and only when they can matter
            peers = self._peers_level() if local < self.BURST else None
            with self._cond:
                now = time.monotonic()
                local = self._level_locked(now)
                if peers is None and local < self.BURST:
                    continue  # this process's burst ended meanwhile: ask the peers first
                level = max(local, peers or self.IDLE)
                hold_left = 0.0
                if level == self.BURST:  # the hold runs from the burst's start, not this write's
                    since = min(self._burst_since if local == self.BURST else now,
                                self._peer_burst_since if peers == self.BURST else now)
                    hold_left = self.hold_s - (now - since)
                if level == self.IDLE or (hold_left <= 0 and self._writing < self.while_binding):
                    self.waits += waited
                    self._writing += 1
                    break
                waited = True
                timeout = hold_left if hold_left > 0 else None
                # when this process's level drops by itself (its linger ends), nothing notifies
                ends = None
                if self._bursts == 0 and now - self._burst_ended < self.linger_s:
                    ends = self._burst_ended + self.linger_s
                elif self._binding == 0 and now - self._bind_ended < self.linger_s:
                    ends = self._bind_ended + self.linger_s
                if ends is not None:
                    timeout = ends - now if timeout is None else min(timeout, ends - now)
                if self.peers is not None:  # the peers' binds end without a notify here
                    timeout = self.PEER_POLL_S if timeout is None else min(timeout, self.PEER_POLL_S)
                self._cond.wait(max(timeout, 0.001) if timeout is not None else None)
        try:
            yield
        finally:
            with self._cond:
                self._writing -= 1
                self._cond.notify_all()
