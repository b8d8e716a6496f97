"""The Ray channel of `shardsched.sharding.calls`: a client's calls to a Ray actor.

Part of the actor layer: only this module and `shardsched.sharding.actors` import ``ray``.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayError, RayTaskError

from shardsched.errors import ShardschedError
from shardsched.sharding.calls import (ActorFailed, Channel, Local, MethodFailed, NoAnswer, RemoteDead,
                                      RemoteUnavailable)

T = TypeVar("T")


class RayReply:
    """The answer of one actor call (a Ray ObjectRef). Dropping it is fire and forget."""

    __slots__ = ("ref", "method", "actor_id")

    def __init__(self, ref: ray.ObjectRef, method: str, actor_id: str = "") -> None:
        self.ref = ref
        self.method = method
        self.actor_id = actor_id  # the actor called, for `ActorFailed.actor_id`

    def wait(self, timeout_s: float | None = 30.0) -> Any:
        """See `shardsched.sharding.calls.Reply.wait`: our own typed errors pass through."""
        try:
            return ray.get(self.ref, timeout=timeout_s)
        except ActorDiedError as e:  # Ray's message goes on for lines (class, ids, pid, address)
            raise RemoteDead(f"{self.method}: the actor died: {str(e).splitlines()[0]}", type(e).__name__,
                             self.actor_id) from None
        except RayActorError as e:  # not dead yet unreachable (ActorUnavailableError)
            raise ActorFailed(f"{self.method}: {type(e).__name__}: {e}", type(e).__name__, self.actor_id) from None
        except GetTimeoutError as e:
            raise NoAnswer(f"{self.method}: {type(e).__name__}: {e}", type(e).__name__) from None
        except RayTaskError as e:  # the method raised
            if isinstance(e.cause, ShardschedError):
                raise e.cause from None
            raise MethodFailed(f"{self.method}: {e.cause if e.cause is not None else e}", e.cause) from None
        except RayError as e:
            raise RemoteUnavailable(f"{self.method}: {e}") from None


class RayChannel:
    """`shardsched.sharding.calls.Channel` to a Ray actor (its handle)."""

    is_actor = True

    def __init__(self, target: ray.actor.ActorHandle) -> None:
        self.target = target
        #: the actor's id (hex), as `ActorFailed.actor_id` names it
        self.actor_id: str = target._actor_id.hex()


    def send(self, method: Callable[..., T], *args: Any) -> RayReply:
        name = method.__name__
        return RayReply(getattr(self.target, name).remote(*args), name, self.actor_id)

    def terminate(self) -> None:
        """``ray.kill``, no restart; safe on a dead actor."""
        try:
            ray.kill(self.target, no_restart=True)
        except (RayError, ValueError):
            pass


def settled(replies: list[Any], timeout_s: float) -> tuple[list[Any], list[Any]]:
    """Wait up to ``timeout_s`` for every reply of ``replies`` (`RayReply`, or one already there):
    (those answered, those still waited for), each in the order given."""
    refs = [r.ref for r in replies if isinstance(r, RayReply)]
    if not refs:
        return list(replies), []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    answered = [r for r in replies if not isinstance(r, RayReply) or r.ref in done]
    return answered, [r for r in replies if isinstance(r, RayReply) and r.ref not in done]


def channel(target: Any) -> Channel:
    """The channel to ``target``: `RayChannel` for an actor handle, else `Local`."""
    return RayChannel(target) if isinstance(target, ray.actor.ActorHandle) else Local(target)
