"""The coordinator: partitions nodes into shards, routes pods, rebalances, watches shard health,
scales. One module per job over one shared state:

- `state`: `CoordinatorState` (tracked pods, shard map and epoch, the cluster's NodeTable) and
  the lock that guards it;
- `intake`: the watch (list, then events; relist on 410), returns what changed;
- `partition`: node -> shard by rendezvous hashing, published in the ledger with an epoch;
- `router`: pending pod -> shard, capacity- and label-aware (`router.Room`);
- `nominator`: the node of a pod that needs the whole cluster's view;
- `rebalancer`: pods a shard handed back, tried elsewhere or counted as a failed attempt;
- `gangs`: a PodGroup's members decided whole over the cluster and held in the ledger all or nothing;
- `events`: FailedScheduling Events and the PodScheduled condition;
- `ledger_sync`: the watch's truth written to the Redis ledger, rebuilt after a Redis restart;
- `health`: shard pings and replacement;
- `scaling`: run-time scale steps and the autoscaler;
- `loop`: `Coordinator`, the jobs wired together and the control loop that runs them.

The pod's life across the processes is described in ``docs/design.md`` (a pod's states).
"""

from shardsched.sharding.coordinator.loop import Coordinator
from shardsched.sharding.coordinator.state import LIMBO, CoordinatorState, ShardRef, Tracked

__all__ = ["LIMBO", "Coordinator", "CoordinatorState", "ShardRef", "Tracked"]
