"""Cyclic garbage collector settings for the processes that hold the cluster's objects.

The coordinator keeps every node and pod it has listed or watched (decoded JSON: about a hundred
dicts and lists per pod), the informers keep them too, the shards keep their queues. CPython's
cyclic collector scans all tracked containers of a generation; with its default thresholds
(700, 10, 10) a burst of new pods (a list, thousands of pods created at once) triggers full
collections that rescan every pod already held, over and over while the heap grows. Measured on
decoding 20,000 new pods into a store that already holds 20,000: 57 us per pod with the defaults,
14 us with the settings below, 10 us with the collector off; replacing pods in a store of steady
size costs about 6 us either way. In `serve --bench` (threads mode) it is the difference between
the informers keeping up with the binds or not (docs/kubernetes.md, Benchmark).

What this module does (the usual recipe for long-lived servers that load a large, acyclic data
set; nothing is turned off):

- `tune` raises the thresholds to (50,000, 20, 100): young collections every 50,000 allocations
  instead of 700, a full collection after 100 middle ones instead of 10 (CPython also waits for the
  long-lived objects to grow by 25% since the last full collection). Cyclic garbage still gets
  collected, a little later; it is a few MB at most.
- `freeze_loaded` runs one full collection, then moves every surviving object to the permanent
  generation (`gc.freeze`), which no collection scans again: called each time the cluster has
  been listed (start, relist after 410 Gone), when most of what the process will hold has just
  been loaded. Frozen objects are still
  freed by reference counting when dropped (a pod's old version when the watch brings a new one);
  only a frozen object that later becomes part of an unreachable reference cycle would stay, which
  the listed objects (JSON trees) cannot.

``SHARDSCHED_GC=default`` in the environment leaves the interpreter's settings alone (both
functions then do nothing), for comparison or in case of doubt.
"""

from __future__ import annotations

import gc
import logging
import os
import time

log = logging.getLogger(__name__)

#: (young, middle, old) thresholds set by `tune`
THRESHOLDS = (50_000, 20, 100)


def enabled() -> bool:
    """False when ``SHARDSCHED_GC=default`` asks for the interpreter's own settings."""
    return os.environ.get("SHARDSCHED_GC", "").strip().lower() != "default"


def tune() -> None:
    """Set `THRESHOLDS` for this process (idempotent; see module docstring)."""
    if enabled():
        gc.set_threshold(*THRESHOLDS)


def freeze_loaded() -> None:
    """Unfreeze, one full collection, then freeze every object alive (module docstring): called
    after each full list of the cluster. The unfreeze first lets the collection free what an
    earlier freeze kept and a relist has since dropped (the previous node table, in cycles with
    its plugins). Takes as long as one full collection of what the process holds (tens of ms for
    10,000 pods)."""
    if not enabled():
        return
    t0 = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    log.debug("gc: froze %d objects in %.0f ms", gc.get_freeze_count(), (time.perf_counter() - t0) * 1000)
