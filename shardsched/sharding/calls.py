"""Typed calls between the scheduler's processes: the same coordinator and shard code runs over
plain objects in one process (the tests, ``serve --mode threads``) and over Ray actors.

A client (`ShardClient`, `CoordinatorClient`, `ClusterClient`) has one method per method of the
component's API (`ShardAPI`, `CoordinatorAPI`, `shardsched.cluster.ClusterBackend`), each sent
through a `Channel` and answered by a `Reply`: drop the reply to fire and forget, or ``wait`` for
it. The channel decides where the call goes: `Local` (a plain object in this process: the call
runs at once, and so do its errors) or the Ray channel of the actor layer
(`shardsched.sharding.remote.RayChannel`). A method is named by its function in the API Protocol
(``ShardAPI.add_pods``), never by a string, so a renamed method is a name error, not a call that
fails at run time in another process. Only the actor layer imports ``ray``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, Mapping, Protocol, Sequence, TypeVar

from shardsched.api.objects import PodInfo
from shardsched.api.workloads import WorkloadKey, WorkloadSelector
from shardsched.cache.node_table import PodUsage
from shardsched.cluster import (Binding, BindResult, Candidate, CandidateResult, Capabilities, ClusterBackend,
                                WatchEvent)
from shardsched.errors import TemporaryError
from shardsched.queue import QueuedPodInfo
from shardsched.sharding.protocols import Handoff

T = TypeVar("T")


class RemoteUnavailable(TemporaryError):
    """The component did not answer (its actor died, or it timed out)."""


class NoAnswer(RemoteUnavailable):
    """The call got no answer: it timed out, or the actor failed (Ray's error type in ``kind``),
    as opposed to a method that ran and raised."""

    def __init__(self, message: str, kind: str = "", delay_s: float = 1.0) -> None:
        super().__init__(message, delay_s)
        self.kind = kind


class ActorFailed(NoAnswer):
    """The call got no answer because the component's actor failed (died, or cannot be reached),
    not because it was slow. ``actor_id``: the actor's id (``RayChannel.actor_id``), to tell which
    component of a run it was."""

    def __init__(self, message: str, kind: str = "", actor_id: str = "") -> None:
        super().__init__(message, kind)
        self.actor_id = actor_id


class RemoteDead(ActorFailed):
    """The component's actor is dead (its process exited or was killed): it will never answer."""


class MethodFailed(RemoteUnavailable):
    """The method ran in the other process and raised an error that is not ours (``cause``: the
    error, or None when it could not be brought back)."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class Reply(Protocol[T]):
    """The answer to one call, which may not have arrived yet."""

    def wait(self, timeout_s: float | None = 30.0) -> T:
        """The call's result, waiting up to ``timeout_s`` (None: no limit).

        Raises: `RemoteUnavailable` (`RemoteDead` when the actor died) when it does not come; the
        component's own `shardsched.errors.ShardschedError` when it raised one."""
        ...


@dataclass(frozen=True, slots=True)
class Done(Generic[T]):
    """A reply already there (a call in this process)."""

    value: T

    def wait(self, timeout_s: float | None = 30.0) -> T:
        return self.value


def wait_all(replies: Sequence[Reply[T]], timeout_s: float | None) -> list[T]:
    """The results of ``replies``, in their order, all within ``timeout_s`` in total (None: no
    limit; the calls run at once, each is waited for what is left of the time).

    Raises: what `Reply.wait` raises, for the first reply that fails."""
    if timeout_s is None:
        return [r.wait(None) for r in replies]
    deadline = time.monotonic() + timeout_s
    return [r.wait(max(0.0, deadline - time.monotonic())) for r in replies]


class Channel(Protocol):
    """Where a client's calls go.

    Attributes:
        target: the plain object, or the Ray actor handle.
        is_actor: whether ``target`` is a Ray actor.
    """

    target: Any
    is_actor: bool

    def send(self, method: Callable[..., T], *args: Any) -> Reply[T]:
        """Call ``method`` (a function of the target's API Protocol) on the target with ``args``."""
        ...

    def terminate(self) -> None:
        """End the target's process (an actor; safe when dead); a plain object is left to the
        garbage collector."""
        ...


class Local:
    """`Channel` to a plain object in this process: a call runs at once, its errors raise at once."""

    is_actor = False

    def __init__(self, target: Any) -> None:
        self.target = target

    def send(self, method: Callable[..., T], *args: Any) -> Reply[T]:
        return Done(getattr(self.target, method.__name__)(*args))

    def terminate(self) -> None:
        pass


class ShardAPI(Protocol):
    """What a shard offers the coordinator (`shardsched.sharding.shard.Shard`)."""

    def ping(self) -> str: ...
    def set_epoch(self, epoch: int) -> None: ...
    def apply_namespaces(self, labels: Mapping[str, Mapping[str, str]], removed: Iterable[str] = (),
                         replace: bool = False) -> None: ...
    def apply_spread_selectors(self, upserts: Iterable[WorkloadSelector] = (), removed: Iterable[WorkloadKey] = (),
                               replace: bool = False) -> None: ...
    def apply_storage(self, upserts: Iterable[Any] = (), removed: Iterable[tuple[str, str]] = (),
                      invalid_pvs: Mapping[str, str] | None = None, replace: bool = False) -> None: ...
    def apply_nodes(self, upserts: Iterable[dict] = (), removals: Iterable[str] = ()) -> None: ...
    def apply_bound(self, adds: Iterable[tuple[PodUsage, str]] = (), removes: Iterable[str] = ()) -> None: ...
    def add_pods(self, pods: Sequence[PodInfo]) -> None: ...
    def accept(self, qpis: Sequence[QueuedPodInfo], unschedulable: bool = False) -> None: ...
    def remove_pods(self, keys: Iterable[str]) -> None: ...
    def pending_keys(self) -> list[str]: ...
    def move_all_to_active_or_backoff_queue(self, event: str = "NodeUpdate") -> None: ...
    def snapshot(self) -> dict[str, Any]: ...
    def drain(self, fraction: float = 1.0) -> list[QueuedPodInfo]: ...
    def retire(self, timeout_s: float = 30.0) -> list[QueuedPodInfo]: ...
    def take_stats(self) -> Any: ...
    def stop(self) -> None: ...


class ShardClient:
    """`ShardAPI` of one shard over a `Channel`; see the methods of `Shard` for what each does."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def ping(self) -> Reply[str]:
        return self.channel.send(ShardAPI.ping)

    def set_epoch(self, epoch: int) -> Reply[None]:
        return self.channel.send(ShardAPI.set_epoch, epoch)

    def apply_namespaces(self, labels: Mapping[str, Mapping[str, str]], removed: Iterable[str],
                         replace: bool) -> Reply[None]:
        return self.channel.send(ShardAPI.apply_namespaces, labels, removed, replace)

    def apply_spread_selectors(self, upserts: Iterable[WorkloadSelector], removed: Iterable[WorkloadKey],
                               replace: bool) -> Reply[None]:
        return self.channel.send(ShardAPI.apply_spread_selectors, upserts, removed, replace)

    def apply_storage(self, upserts: Iterable[Any], removed: Iterable[tuple[str, str]],
                      invalid_pvs: Mapping[str, str], replace: bool) -> Reply[None]:
        return self.channel.send(ShardAPI.apply_storage, upserts, removed, invalid_pvs, replace)

    def apply_nodes(self, upserts: Iterable[dict], removals: Iterable[str]) -> Reply[None]:
        return self.channel.send(ShardAPI.apply_nodes, upserts, removals)

    def apply_bound(self, adds: Iterable[tuple[PodUsage, str]], removes: Iterable[str]) -> Reply[None]:
        return self.channel.send(ShardAPI.apply_bound, adds, removes)

    def add_pods(self, pods: Sequence[PodInfo]) -> Reply[None]:
        return self.channel.send(ShardAPI.add_pods, pods)

    def accept(self, qpis: Sequence[QueuedPodInfo], unschedulable: bool) -> Reply[None]:
        return self.channel.send(ShardAPI.accept, qpis, unschedulable)

    def remove_pods(self, keys: Iterable[str]) -> Reply[None]:
        return self.channel.send(ShardAPI.remove_pods, keys)

    def pending_keys(self) -> Reply[list[str]]:
        return self.channel.send(ShardAPI.pending_keys)

    def move_all_to_active_or_backoff_queue(self, event: str) -> Reply[None]:
        return self.channel.send(ShardAPI.move_all_to_active_or_backoff_queue, event)

    def snapshot(self) -> Reply[dict[str, Any]]:
        return self.channel.send(ShardAPI.snapshot)

    def drain(self, fraction: float) -> Reply[list[QueuedPodInfo]]:
        return self.channel.send(ShardAPI.drain, fraction)

    def retire(self, timeout_s: float) -> Reply[list[QueuedPodInfo]]:
        return self.channel.send(ShardAPI.retire, timeout_s)

    def take_stats(self) -> Reply[Any]:
        return self.channel.send(ShardAPI.take_stats)

    def stop(self) -> Reply[None]:
        return self.channel.send(ShardAPI.stop)


class ShardHostAPI(Protocol):
    """What a shard's process offers beside `ShardAPI` (`shardsched.sharding.actors.ShardHost`):
    its pid and its Prometheus samples, for whoever started the run."""

    def pid(self) -> int: ...
    def metric_samples(self) -> list: ...


class ShardHostClient(ShardClient):
    """`ShardClient` of a shard in its own process, with `ShardHostAPI`'s calls too."""

    def pid(self) -> Reply[int]:
        return self.channel.send(ShardHostAPI.pid)

    def metric_samples(self) -> Reply[list]:
        return self.channel.send(ShardHostAPI.metric_samples)


class CoordinatorAPI(Protocol):
    """What the coordinator's process offers the shards (``handoff``, ``committed``) and whoever started or joins
    the run (`shardsched.sharding.actors.CoordinatorHost`; the API server's coordinator adds the
    ``cluster_*`` calls and ``stop_cluster``: `shardsched.kube.serving`)."""

    def handoff(self, shard: int, items: list[Handoff]) -> None: ...
    def committed(self, shard: int, epoch: int, uids: list[str]) -> None: ...
    def start(self, adopt: bool = False) -> dict: ...
    def status(self) -> dict: ...
    def unschedulable_reasons(self) -> dict: ...
    def pending_keys(self) -> list[str]: ...
    def catch_up(self) -> None: ...
    def kill_shard(self, index: int) -> None: ...
    def replace_shard(self, index: int) -> str: ...
    def scale(self, n: int, trigger: str = "api") -> dict: ...
    def scale_history(self) -> list[dict]: ...
    def retired_shard_stats(self) -> list: ...
    def metric_samples(self) -> list: ...
    def pid(self) -> int: ...
    def shards(self) -> list[Any]: ...
    def stop(self, flush_timeout_s: float = 5.0) -> None: ...
    def cluster_health(self) -> dict: ...
    def cluster_metrics(self) -> list: ...
    def coordinator_metrics(self) -> list: ...
    def stop_cluster(self, flush_timeout_s: float = 5.0) -> None: ...


class CoordinatorClient:
    """`CoordinatorAPI` over a `Channel`; also a shard's `shardsched.sharding.protocols.Rebalancer`
    (its hand-offs are fire and forget)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def handoff(self, shard: int, items: list[Handoff]) -> Reply[None]:
        return self.channel.send(CoordinatorAPI.handoff, shard, items)

    def committed(self, shard: int, epoch: int, uids: list[str]) -> Reply[None]:
        return self.channel.send(CoordinatorAPI.committed, shard, epoch, uids)

    def start(self, adopt: bool = False) -> Reply[dict]:
        return self.channel.send(CoordinatorAPI.start, adopt)

    def status(self) -> Reply[dict]:
        return self.channel.send(CoordinatorAPI.status)

    def unschedulable_reasons(self) -> Reply[dict]:
        return self.channel.send(CoordinatorAPI.unschedulable_reasons)

    def pending_keys(self) -> Reply[list[str]]:
        return self.channel.send(CoordinatorAPI.pending_keys)

    def catch_up(self) -> Reply[None]:
        return self.channel.send(CoordinatorAPI.catch_up)

    def kill_shard(self, index: int) -> Reply[None]:
        return self.channel.send(CoordinatorAPI.kill_shard, index)

    def replace_shard(self, index: int) -> Reply[str]:
        return self.channel.send(CoordinatorAPI.replace_shard, index)

    def scale(self, n: int) -> Reply[dict]:
        return self.channel.send(CoordinatorAPI.scale, n)

    def scale_history(self) -> Reply[list[dict]]:
        return self.channel.send(CoordinatorAPI.scale_history)

    def retired_shard_stats(self) -> Reply[list]:
        return self.channel.send(CoordinatorAPI.retired_shard_stats)

    def metric_samples(self) -> Reply[list]:
        return self.channel.send(CoordinatorAPI.metric_samples)

    def pid(self) -> Reply[int]:
        return self.channel.send(CoordinatorAPI.pid)

    def shards(self) -> Reply[list[Any]]:
        """The targets of the current shards' channels (actor handles, for a Ray coordinator)."""
        return self.channel.send(CoordinatorAPI.shards)

    def stop(self, flush_timeout_s: float = 5.0) -> Reply[None]:
        return self.channel.send(CoordinatorAPI.stop, flush_timeout_s)

    def cluster_health(self) -> Reply[dict]:
        return self.channel.send(CoordinatorAPI.cluster_health)

    def cluster_metrics(self) -> Reply[list]:
        return self.channel.send(CoordinatorAPI.cluster_metrics)

    def coordinator_metrics(self) -> Reply[list]:
        return self.channel.send(CoordinatorAPI.coordinator_metrics)

    def stop_cluster(self, flush_timeout_s: float = 5.0) -> Reply[None]:
        return self.channel.send(CoordinatorAPI.stop_cluster, flush_timeout_s)


class ClusterClient:
    """`ClusterBackend` over a `Channel`: the calls the coordinator and the shards make."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def list_nodes(self) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_nodes)

    def list_pods(self) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_pods)

    def list_namespaces(self) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_namespaces)

    def list_pdbs(self) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_pdbs)

    def list_pod_groups(self) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_pod_groups)

    def list_spread_selectors(self) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_spread_selectors)

    def list_storage(self, kind: str) -> Reply[tuple[list[dict], int]]:
        return self.channel.send(ClusterBackend.list_storage, kind)

    def get_capabilities(self) -> Reply[Capabilities]:
        return self.channel.send(ClusterBackend.get_capabilities)

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> Reply[None]:
        return self.channel.send(ClusterBackend.bind_volume, pv_name, namespace, claim, claim_uid)

    def set_selected_node(self, namespace: str, claim: str, node: str) -> Reply[None]:
        return self.channel.send(ClusterBackend.set_selected_node, namespace, claim, node)

    def claim_bound(self, namespace: str, claim: str) -> Reply[bool]:
        return self.channel.send(ClusterBackend.claim_bound, namespace, claim)

    def events_since(self, rv: int | str, kinds: Iterable[str] | None, limit: int | None,
                     wait_s: float | None = None) -> Reply[tuple[list[WatchEvent], int]]:
        return self.channel.send(ClusterBackend.events_since, rv, kinds, limit, wait_s)

    def delete_pod(self, namespace: str, name: str, uid: str | None,
                   grace_period_s: int | None) -> Reply[Any]:
        return self.channel.send(ClusterBackend.delete_pod, namespace, name, uid, grace_period_s)

    def set_disruption_target(self, namespace: str, name: str, scheduler_name: str) -> Reply[bool]:
        return self.channel.send(ClusterBackend.set_disruption_target, namespace, name, scheduler_name)

    def set_nominated_node_name(self, namespace: str, name: str, node_name: str) -> Reply[bool]:
        return self.channel.send(ClusterBackend.set_nominated_node_name, namespace, name, node_name)

    def bind_many(self, bindings: Sequence[Binding | tuple]) -> Reply[list[BindResult]]:
        return self.channel.send(ClusterBackend.bind_many, bindings)

    def prepare_candidates(self, candidates: Sequence[Candidate]) -> Reply[list[CandidateResult]]:
        return self.channel.send(ClusterBackend.prepare_candidates, candidates)

    def set_pod_condition(self, namespace: str, name: str, condition: Mapping[str, Any]) -> Reply[Any]:
        return self.channel.send(ClusterBackend.set_pod_condition, namespace, name, condition)

    def record_event(self, obj_ref: Mapping[str, Any], type: str, reason: str,  # noqa: A002
                     message: str) -> Reply[Any]:
        return self.channel.send(ClusterBackend.record_event, obj_ref, type, reason, message)


class SimClusterAPI(Protocol):
    """What the simulated cluster's process offers beside `ClusterBackend` to whoever drives a run
    (`shardsched.sharding.sim_actor.SimClusterHost`): the workload's objects in, the counts out."""

    def create_nodes(self, objs: Iterable[Any]) -> list[dict]: ...
    def delete_node(self, name: str, delete_pods: bool = False) -> dict: ...
    def create_pods(self, objs: Iterable[Any]) -> list[dict]: ...
    def get_pod(self, namespace: str, name: str) -> dict: ...
    def put_spread_selector(self, obj: Any) -> dict: ...
    def create_pod_group(self, obj: Any) -> dict: ...
    def create_volume_objects(self, objs: Iterable[Any]) -> list[dict]: ...
    def progress(self) -> dict[str, Any]: ...
    def invariants(self) -> dict[str, Any]: ...
    def bind_times(self) -> dict[str, list]: ...
    def pid(self) -> int: ...


class SimClusterClient(ClusterClient):
    """`ClusterClient` of the simulated cluster, with `SimClusterAPI`'s calls too."""

    def create_nodes(self, objs: Iterable[Any]) -> Reply[list[dict]]:
        return self.channel.send(SimClusterAPI.create_nodes, objs)

    def delete_node(self, name: str, delete_pods: bool = False) -> Reply[dict]:
        return self.channel.send(SimClusterAPI.delete_node, name, delete_pods)

    def create_pods(self, objs: Iterable[Any]) -> Reply[list[dict]]:
        return self.channel.send(SimClusterAPI.create_pods, objs)

    def get_pod(self, namespace: str, name: str) -> Reply[dict]:
        return self.channel.send(SimClusterAPI.get_pod, namespace, name)

    def put_spread_selector(self, obj: Any) -> Reply[dict]:
        return self.channel.send(SimClusterAPI.put_spread_selector, obj)

    def create_pod_group(self, obj: Any) -> Reply[dict]:
        return self.channel.send(SimClusterAPI.create_pod_group, obj)

    def create_volume_objects(self, objs: Iterable[Any]) -> Reply[list[dict]]:
        return self.channel.send(SimClusterAPI.create_volume_objects, objs)

    def progress(self) -> Reply[dict[str, Any]]:
        return self.channel.send(SimClusterAPI.progress)

    def invariants(self) -> Reply[dict[str, Any]]:
        return self.channel.send(SimClusterAPI.invariants)

    def bind_times(self) -> Reply[dict[str, list]]:
        return self.channel.send(SimClusterAPI.bind_times)

    def pid(self) -> Reply[int]:
        return self.channel.send(SimClusterAPI.pid)


class ClusterBinds:
    """A shard's `shardsched.sharding.protocols.BindTarget` over a `ClusterClient`: a Ray actor
    (the simulated cluster), or a backend object living in this process (a shard actor's copy of
    the Kubernetes backend)."""

    def __init__(self, cluster: ClusterClient, timeout_s: float = 30.0) -> None:
        self.cluster = cluster
        self.timeout_s = timeout_s
        # a local backend's binds-first gate (`shardsched.kube.gate.BindsFirst`), so that the
        # shard marks its binds for the writers of the other processes; an actor's stays its own
        self.gate = None if cluster.channel.is_actor else cluster.channel.target.gate

    def bind_many(self, bindings: Sequence[Binding | tuple]) -> list[BindResult]:
        return self.cluster.bind_many(bindings).wait(self.timeout_s)

    def bind_volume(self, pv_name: str, namespace: str, claim: str, claim_uid: str) -> None:
        self.cluster.bind_volume(pv_name, namespace, claim, claim_uid).wait(self.timeout_s)

    def set_selected_node(self, namespace: str, claim: str, node: str) -> None:
        self.cluster.set_selected_node(namespace, claim, node).wait(self.timeout_s)

    def claim_bound(self, namespace: str, claim: str) -> bool:
        return self.cluster.claim_bound(namespace, claim).wait(self.timeout_s)
