"""`shardsched.gctune`: the collector settings of the processes that hold the cluster's objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from shardsched import gctune

PROBE = """
import gc, json
from shardsched import gctune
before = gc.get_threshold()
gctune.tune()
kept = [{"metadata": {"name": str(i)}, "spec": {"containers": [{"name": "c"}]}} for i in range(1000)]
import weakref
class Table:  # an old node table in a cycle with its plugins, as a relist drops it
    pass
old = Table(); old.me = old; gone = weakref.ref(old)
gctune.freeze_loaded()
frozen = gc.get_freeze_count()
del old  # the relist replaced it: cyclic garbage, but frozen
gctune.freeze_loaded()  # the relist's freeze
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen,
                  "old_table_freed": gone() is None}))
"""


def probe(env_gc: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SHARDSCHED_GC"}
    if env_gc is not None:
        env["SHARDSCHED_GC"] = env_gc
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_tune_raises_the_thresholds_and_freeze_moves_the_loaded_objects_out_of_the_collections():
    got = probe(None)
    assert tuple(got["after"]) == gctune.THRESHOLDS != tuple(got["before"])
    assert got["frozen"] > 3000  # the 1,000 listed objects (3 containers each) and what was alive
    assert got["old_table_freed"], "a later freeze first collects what an earlier one kept and is now garbage"


def test_shardsched_gc_default_leaves_the_interpreter_alone():
    got = probe("default")
    assert got["after"] == got["before"]
    assert got["frozen"] == 0


def test_ray_actors_of_the_scheduler_run_with_the_tuned_collector(ray_session):
    """The actors (simulated cluster, shards, coordinator) call `tune` in their own process."""
    import gc

    import ray

    from shardsched.sharding.sim_actor import SimClusterHost

    host = ray.remote(SimClusterHost).remote()
    try:
        assert tuple(ray.get(host.__ray_call__.remote(lambda self: gc.get_threshold()), timeout=60)) == gctune.THRESHOLDS
    finally:
        ray.kill(host)
