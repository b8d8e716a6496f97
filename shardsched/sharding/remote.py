"""One way to call a component whether it is a plain object in this process or a Ray actor.

The coordinator talks to shards and to the cluster through `Remote`, so the same code runs in the
tests (plain objects, no Ray) and in the product (Ray actors). Only this module and
`shardsched.sharding.actors` import ``ray``.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayError, RayTaskError

from shardsched.errors import ShardschedError, TemporaryError


class RemoteUnavailable(TemporaryError):
    """The component did not answer (its actor died, or it timed out)."""


class RemoteDead(RemoteUnavailable):
    """The component's actor is dead (its process exited or was killed): it will never answer."""


class Remote:
    """Wraps a local object or a Ray actor handle.

    ``call`` is fire-and-forget (for a local object it runs at once); ``ask`` waits for the result
    and raises `RemoteUnavailable` when the actor is dead or too slow.
    """

    def __init__(self, target: Any) -> None:
        self.target = target
        self.is_actor = isinstance(target, ray.actor.ActorHandle)

    def call(self, method: str, *args: Any) -> Any:
        if self.is_actor:
            return getattr(self.target, method).remote(*args)
        getattr(self.target, method)(*args)
        return None

    def ask(self, method: str, *args: Any, timeout_s: float | None = 30.0) -> Any:
        if not self.is_actor:
            return getattr(self.target, method)(*args)
        try:
            return ray.get(getattr(self.target, method).remote(*args), timeout=timeout_s)
        except ActorDiedError as e:  # Ray's message goes on for lines (class, ids, pid, address)
            raise RemoteDead(f"{method}: the actor died: {str(e).splitlines()[0]}") from None
        except (GetTimeoutError, RayActorError) as e:
            raise RemoteUnavailable(f"{method}: {type(e).__name__}: {e}") from None
        except RayTaskError as e:  # the method raised: our own typed errors pass through
            if isinstance(e.cause, ShardschedError):
                raise e.cause from None
            raise RemoteUnavailable(f"{method}: {e}") from None
        except RayError as e:
            raise RemoteUnavailable(f"{method}: {e}") from None

    def terminate(self) -> None:
        """End an actor's process (``ray.kill``, no restart); a local object is left to the garbage
        collector. Safe on a dead actor."""
        if self.is_actor:
            try:
                ray.kill(self.target, no_restart=True)
            except (RayError, ValueError):
                pass


class RemoteBindTarget:
    """`BindTarget` over a `Remote` cluster: a Ray actor (the simulated cluster), or a backend
    object living in this process (a shard actor's copy of the Kubernetes backend)."""

    def __init__(self, cluster: Remote, timeout_s: float = 30.0) -> None:
        self.cluster = cluster
        self.timeout_s = timeout_s
        # a local backend's binds-first gate (`shardsched.kube.gate.BindsFirst`), so that the
        # shard marks its binds for the writers of the other processes; an actor's stays its own
        self.gate = None if cluster.is_actor else cluster.target.gate

    def bind_many(self, bindings):
        return self.cluster.ask("bind_many", bindings, timeout_s=self.timeout_s)


class RemoteRebalancer:
    """`Rebalancer` over a `Remote` coordinator (fire and forget)."""

    def __init__(self, coordinator: Remote) -> None:
        self.coordinator = coordinator

    def handoff(self, shard: int, items) -> None:
        self.coordinator.call("handoff", shard, items)
