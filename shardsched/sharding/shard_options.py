"""The tunables (`ShardOptions`) and the counters (`ShardStats`) of one shard (`shardsched.sharding.shard`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ShardOptions:
    """Tunables of one shard; the defaults are explained per field.

    Attributes:
        batch_size: pods per batch. Large batches amortize one Redis round trip and one bind call
            over many pods (the per-batch fixed cost is ~1-2 ms here); 0 = adaptive: the whole
            active queue up to `max_batch_size`.
        max_batch_size: cap of the adaptive batch.
        lease_ttl_ms: pod lease lifetime. A crashed shard's pods move on after it; long enough to
            cover one batch's reserve + bind even when the API is slow.
        reservation_ttl_ms: how long a reservation holds capacity without a commit.
        idle_sleep_s: the longest the loop waits when there is nothing to do; it is woken at once
            by a pod entering activeQ, the next backoff or unschedulable timeout, a binding cycle
            ending, or a stop (`SchedulingQueue.wait_for_pods`), so this bounds only what is due
            by time alone (the binds mark's renewal, the shadows' expiry).
        binding_cycles: batches whose binding cycle (Permit + bind) may run in the background while
            the next batch is scheduled (module docstring); 0 = bind inside the step. Against a
            real API server, where a batch's binds take most of a second, 2 keeps the API busy
            while the shard schedules; `step`-driven tests use 0.
    """

    batch_size: int = 0
    max_batch_size: int = 1000
    lease_ttl_ms: int = 10_000
    reservation_ttl_ms: int = 10_000
    idle_sleep_s: float = 0.05
    binding_cycles: int = 0
    seed: int | None = None


@dataclass
class ShardStats:
    """Counters of one shard (plain, picklable, of a fixed size: what a benchmark measures per pod
    is timed by the simulated cluster, `SimClusterHost.bind_times`)."""

    scheduled: int = 0
    bound: int = 0
    conflicts: int = 0
    reserve_failures: int = 0
    bind_errors: int = 0
    handed_off: int = 0
    lease_busy: int = 0
    batches: int = 0
    paused_s: float = 0.0
