"""The Redis ledger: node reservations and pod leases that make racing shards safe.

Redis is the arbiter between shards: a shard's Reserve of a batch is re-checked here against the
node's allocatable, the pod's lease (fencing token) and the shard map's epoch, atomically, in one
Lua script call per batch. The cluster (API server) stays the truth about bindings; `observe`,
`forget` and `reconcile` bring the ledger back to it.

All amounts are canonical integers (`shardsched.api.quantity`): cpu in millicores, memory and
ephemeral-storage in bytes, everything else a count; every pod also takes ``pods: 1``. Amounts
must be at most 2**53 (Lua numbers are doubles). Times are Redis server time; TTLs are given in
milliseconds.

Key layout (``P`` is the prefix, ``"ss:"`` by default; node names and pod uids follow it):

=========================  ======  ===============================================================
key                        type    content
=========================  ======  ===============================================================
``P epoch``                string  shard-map epoch, only ever raised (`set_owners`)
``P owners``               hash    node name -> owner shard id (the shard map)
``P token``                string  fencing-token counter shared by all pods (INCR)
``P pod:<uid>``            hash    lease ``s`` shard id, ``t`` token, ``e`` expiry (server ms);
                                   ``rn`` node of the pod's latest reservation (a pointer that
                                   `observe` follows; may be stale). Expires (PEXPIRE) with its
                                   lease, as garbage collection.
``P node:<name>``          hash    ``a:<res>`` allocatable, ``u:<res>`` used by bound pods,
                                   ``r:<res>`` reserved, ``up`` server ms of the last upsert
                                   (present only for known nodes)
``P resv:<name>``          hash    pod uid -> reservation ``[shard, token, requests]`` (JSON)
``P rexp:<name>``          zset    pod uid scored by reservation expiry (server ms), for sweeping
``P bound:<name>``         hash    pod uid -> requests of a bound pod counted in ``u:``
``P nom:<name>``           hash    pod uid -> a preemptor's nomination on the node
                                   ``[priority, requests, victim uids, expiry]`` (JSON,
                                   `nominate`): held against pods of lower or equal priority
``P vol:<volume>``          string  uid of the pod whose binding chose the volume (``pv/<name>``
                                   or ``pvc/<namespace>/<name>``), with a TTL
                                   (`reserve_volumes`): a PV is reserved for one pod at a time
``P binding``              zset    shard id scored by the expiry (server ms) of its "binds in
                                   flight" mark (`mark_binding`), which the Event and condition
                                   writers of every process yield to
``P bursting``             zset    the same, for the shards whose binds in flight include a burst
                                   (a bind call that fills its request slots): the writers hold
                                   back longer (`shardsched.kube.gate.BindsFirst`)
=========================  ======  ===============================================================

Requests travel and are stored as a JSON flat list ``["pods",1,"cpu",500,...]`` in the order
kube-scheduler's NodeResourcesFit checks them (pod count, cpu, memory, ephemeral-storage, then the
rest by name), which is the order in which reserve names the first insufficient resource.
Scripts on pod batches take the batch as one JSON argument and answer one JSON array: a few long
strings cost redis-py far less than thousands of arguments and reply elements. Each script's
header (``lua/*.lua``) states its KEYS, ARGV and return codes; ``lua/lib.lua`` holds the helpers
prepended to all of them.

Every script touches only the keys passed in KEYS, so all keys of one ledger can live in one
Redis (a Redis Cluster would need a hash tag in the prefix, e.g. ``"{ss}:"``).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass
from enum import IntEnum
from importlib import resources
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence, TypeVar

import redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError, TryAgainError

from shardsched.api.quantity import CPU, EPHEMERAL_STORAGE, MEMORY, PODS
from shardsched.cache.devices import ledger_allocatable, ledger_requests
from shardsched.errors import FencedOffError, PermanentError, TemporaryError

#: Largest amount the scripts handle exactly (Lua numbers are IEEE doubles).
MAX_AMOUNT = 2**53

_FIT_ORDER = (PODS, CPU, MEMORY, EPHEMERAL_STORAGE)
_SCRIPTS = (
    "node_upsert", "node_remove", "set_owners",
    "lease_acquire", "lease_renew", "lease_release",
    "reserve", "permit", "commit", "release", "observe", "forget", "reconcile", "sweep",
    "binding_mark", "binding_any", "nominate", "nominate_renew", "unnominate", "gang_reserve",
    "volume_reserve", "volume_release",
)
_OBSERVE_MOVED = 7  # observe.lua: the pod's reservation is on a node whose keys were not passed
_OBSERVE_ATTEMPTS = 5


class ReserveCode(IntEnum):
    """Outcome of reserving one pod (reserve.lua), checked in this order:
    LEASE_LOST, FENCED, NODE_UNKNOWN, INSUFFICIENT; else OK."""

    OK = 0
    INSUFFICIENT = 1
    LEASE_LOST = 2
    FENCED = 3
    NODE_UNKNOWN = 4


class LedgerCode(IntEnum):
    """Outcome of one pod in commit, release, observe and forget (see each method)."""

    ADDED = 1
    CONVERTED = 2
    ALREADY = 3
    RELEASED = 4
    REMOVED = 5
    NOT_FOUND = 6
    #: observe: a pod counted before with other requests (an in-place resize) counts these now
    RESIZED = 8


@dataclass(frozen=True, slots=True)
class NodeEntry:
    """A node for `Ledger.upsert_nodes`: allocatable in canonical units; ``owner`` shard id, or
    None to leave the shard map as it is."""

    name: str
    allocatable: Mapping[str, int]
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class ReservationRef:
    """A pod's reservation: on ``node``, made with lease ``token``."""

    uid: str
    node: str
    token: int


@dataclass(frozen=True, slots=True)
class ReserveItem(ReservationRef):
    """A pod to reserve on ``node`` with lease ``token``; ``requests`` in canonical units
    (``pods: 1`` is always counted, whatever the mapping says); ``priority`` decides which
    nominations on the node count against it (those of equal or higher priority); ``devices``
    the indices of the GPU devices chosen on the node, each checked and reserved for the pod's
    share of it (`shardsched.cache.devices.ledger_requests`)."""

    requests: Mapping[str, int]
    priority: int = 0
    devices: tuple[int, ...] = ()


class GangCode(IntEnum):
    """Outcome of a gang in `Ledger.reserve_gangs` (gang_reserve.lua), checked per member in this
    order: FENCED, LEASE_HELD, NODE_UNKNOWN, INSUFFICIENT; else OK."""

    OK = 0
    INSUFFICIENT = 1
    LEASE_HELD = 2
    FENCED = 3
    NODE_UNKNOWN = 4


@dataclass(frozen=True, slots=True)
class GangMember:
    """A gang member to hold on ``node``, which ``shard`` owns and will bind it; ``requests`` in
    canonical units (``pods: 1`` always counted); ``priority`` and ``devices`` (the GPU devices
    held for it on the node, each for its share) as in `ReserveItem`."""

    uid: str
    node: str
    shard: str
    requests: Mapping[str, int]
    priority: int = 0
    devices: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GangResult:
    """Outcome of one gang in `Ledger.reserve_gangs`: ``code``; when not OK, ``uid`` is the first
    member that failed and ``detail`` the insufficient resource (INSUFFICIENT) or the lease holder
    (LEASE_HELD)."""

    code: GangCode
    uid: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code is GangCode.OK


@dataclass(frozen=True, slots=True)
class NominateItem:
    """A preemptor's nomination for `Ledger.nominate_many`: ``requests`` in canonical units held on
    ``node`` for pods of priority <= ``priority``; ``victims``, the uids of the pods deleted for it
    there; ``devices``, the GPU devices held for it on the node, each for its share (as in
    `ReserveItem`: checked against the device's room net of the victims, and counted by
    `reserve` for every other pod of the device)."""

    uid: str
    node: str
    priority: int
    requests: Mapping[str, int]
    victims: tuple[str, ...] = ()
    devices: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NominateResult:
    """Outcome of `Ledger.nominate`: ``code`` OK, INSUFFICIENT (``resource`` names the first that
    does not fit once the victims are gone) or NODE_UNKNOWN; ``dropped``, the uids of the
    lower-priority nominations the node no longer holds (their preemptors lose their nomination)."""

    code: ReserveCode
    resource: str = ""
    dropped: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code is ReserveCode.OK


@dataclass(frozen=True, slots=True)
class ReserveResult:
    """Outcome of one `ReserveItem`; ``resource`` names the first insufficient resource when
    ``code`` is INSUFFICIENT, else it is empty."""

    uid: str
    node: str
    code: ReserveCode
    resource: str = ""

    @property
    def ok(self) -> bool:
        return self.code is ReserveCode.OK


@dataclass(frozen=True, slots=True)
class BoundPod:
    """A pod the cluster shows bound to ``node``; ``requests`` in canonical units; ``devices`` the
    GPU devices it holds there (counted as in `ReserveItem`)."""

    uid: str
    node: str
    requests: Mapping[str, int]
    devices: tuple[int, ...] = ()


class NodeUsage(NamedTuple):
    """A node's ledger counters, resource -> canonical amount, zero entries left out."""

    allocatable: dict[str, int]
    used: dict[str, int]
    reserved: dict[str, int]


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """``drift``: the ledger's usage or reserved counters differed from the truth."""

    drift: bool
    bound_pods: int
    reservations: int


@dataclass(frozen=True, slots=True)
class FenceView:
    """What the ledger says about one pod on one node, for audits: its lease (``holder`` shard,
    ``token``, ``expiry_ms`` in server ms; all None without a lease), the shard and token of its
    reservation on the node (None without one) and the node's owner in the shard map."""

    holder: str | None
    token: int | None
    expiry_ms: int | None
    reserved_by: tuple[str, int] | None
    owner: str | None


@functools.cache
def _script_sources() -> dict[str, str]:
    folder = resources.files("shardsched.store") / "lua"
    lib = (folder / "lib.lua").read_text()
    return {name: f"{lib}\n{(folder / f'{name}.lua').read_text()}" for name in _SCRIPTS}


_F = TypeVar("_F", bound=Callable[..., Any])


def _translate_errors(method: _F) -> _F:
    """Turn redis-py exceptions into shardsched's: unreachable, timing out, loading, read-only or
    out of memory -> TemporaryError; refused credentials and script/command errors (bugs) ->
    PermanentError."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except (redis.AuthenticationError, redis.exceptions.AuthorizationError) as e:
            raise PermanentError(f"ledger {method.__name__}: Redis refused the credentials: {e}") from e
        except (redis.ConnectionError, redis.TimeoutError, ReadOnlyError, OutOfMemoryError, TryAgainError) as e:
            raise TemporaryError(f"ledger {method.__name__}: Redis unavailable: {e}") from e
        except redis.RedisError as e:
            raise PermanentError(f"ledger {method.__name__}: {e}") from e

    return wrapper  # type: ignore[return-value]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _encode_resources(amounts: Mapping[str, int], *, pod: bool) -> str:
    """Resource list JSON (module docstring); zeros dropped; ``pods: 1`` forced when ``pod``.

    Raises:
        ValueError: a name is empty or an amount is not an int in [0, 2**53].
    """
    for name, amount in amounts.items():  # before the cache, where True == 1 == 1.0
        if type(amount) is not int:
            raise ValueError(f"amount of {name} must be an int, got {amount!r}")
    return _encode_resource_items(tuple(amounts.items()), pod)


@functools.lru_cache(maxsize=4096)  # pods of one workload share their requests
def _encode_resource_items(items: tuple[tuple[str, int], ...], pod: bool) -> str:
    values: dict[str, int] = {}
    for name, amount in items:
        if not isinstance(name, str) or not name:
            raise ValueError(f"invalid resource name {name!r}")
        if not 0 <= amount <= MAX_AMOUNT:
            raise ValueError(f"amount of {name} must be in [0, 2**53], got {amount}")
        if amount:
            values[name] = amount
    if pod:
        values[PODS] = 1
    order = [r for r in _FIT_ORDER if r in values] + sorted(r for r in values if r not in _FIT_ORDER)
    return _json([x for r in order for x in (r, values[r])])


def _check_unique(uids: Sequence[str]) -> None:
    if len(set(uids)) != len(uids):
        raise ValueError("a batch names the same pod uid more than once")


def _check_ttl(ttl_ms: int) -> None:
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be a positive int, got {ttl_ms!r}")


class Ledger:
    """Python API of the Redis ledger (see module docstring for keys, units and encodings).

    Args:
        client: a ``redis.Redis`` (`shardsched.store.server.connect` gives one with sensible
            timeouts and retries).
        prefix: prefix of every key; ledgers with different prefixes are independent.

    Every method raises ``TemporaryError`` when Redis is unreachable or times out (retry later),
    ``PermanentError`` on a refused password or a script error, and ``ValueError`` on malformed
    arguments (a bug of the caller). Batch methods take any number of pods in one Redis call and
    reject batches naming a pod uid twice; an empty batch does not call Redis.
    Thread-safe (redis-py's connection pool is).
    """

    def __init__(self, client: redis.Redis, prefix: str = "ss:") -> None:
        if not prefix:
            raise ValueError("prefix must not be empty")
        self.client = client
        self.prefix = prefix
        self._scripts = {name: client.register_script(src) for name, src in _script_sources().items()}

    # Keys

    def _pod_key(self, uid: str) -> str:
        return f"{self.prefix}pod:{uid}"

    def _nom_key(self, node: str) -> str:
        return f"{self.prefix}nom:{node}"

    def _node_keys(self, nodes: Sequence[str]) -> list[str]:
        p = self.prefix
        return [key for n in nodes for key in (f"{p}node:{n}", f"{p}resv:{n}", f"{p}rexp:{n}", f"{p}bound:{n}")]

    # Nodes and the shard map

    @_translate_errors
    def upsert_nodes(self, nodes: Iterable[NodeEntry]) -> int:
        """Add nodes or replace their allocatable (resources not listed become 0); set their owner
        shard when ``owner`` is given. Used and reserved counters are kept. Idempotent.

        Returns: how many nodes were not known before.
        """
        nodes = list(nodes)
        if not nodes:
            return 0
        args = [x for n in nodes for x in (n.name, n.owner or "", _encode_resources(ledger_allocatable(n.allocatable), pod=False))]
        keys = [f"{self.prefix}owners"] + [f"{self.prefix}node:{n.name}" for n in nodes]
        return int(self._scripts["node_upsert"](keys=keys, args=args))

    @_translate_errors
    def remove_nodes(self, names: Iterable[str]) -> int:
        """Forget nodes: allocatable, usage, reservations and their shard-map entry. Idempotent.

        Returns: how many of them were known.
        """
        names = list(dict.fromkeys(names))
        if not names:
            return 0
        return int(self._scripts["node_remove"](keys=[f"{self.prefix}owners"] + self._node_keys(names), args=names))

    @_translate_errors
    def set_owners(self, owners: Mapping[str, str | None], epoch: int) -> None:
        """Set the owner shard of nodes (None removes a node from the map; nodes not named keep
        theirs) and the map's epoch, atomically. An equal epoch re-applies (idempotent retry).

        Raises:
            FencedOffError: ``epoch`` is lower than the current epoch (a newer coordinator
                published a map); nothing is changed.
        """
        args: list[str | int] = [int(epoch)]
        for node, shard in owners.items():
            args += [node, shard or ""]
        applied, current = self._scripts["set_owners"](
            keys=[f"{self.prefix}epoch", f"{self.prefix}owners"], args=args)
        if not applied:
            raise FencedOffError(f"shard map epoch {epoch} is older than the current epoch {current}")

    @_translate_errors
    def epoch(self) -> int:
        """The current shard-map epoch (0 before the first `set_owners`)."""
        return int(self.client.get(f"{self.prefix}epoch") or 0)

    @_translate_errors
    def instance_id(self) -> str:
        """The Redis server's run id (``INFO server``): it changes when the server restarts, which is
        how a coordinator notices that the ledger may have lost data and must be rebuilt."""
        return str(self.client.info("server")["run_id"])

    @_translate_errors
    def owners(self) -> dict[str, str]:
        """The shard map: node name -> owner shard id."""
        return {_text(k): _text(v) for k, v in self.client.hgetall(f"{self.prefix}owners").items()}

    # Leases

    @_translate_errors
    def acquire_leases(self, uids: Iterable[str], shard: str, ttl_ms: int) -> dict[str, int]:
        """Take the leases of pods for ``shard`` for ``ttl_ms`` milliseconds (server time).

        A free or expired lease is granted with a new fencing token (tokens increase across all
        pods); a live lease already held by ``shard`` keeps its token and is extended.

        Returns: uid -> token (> 0) for the pods granted; a uid missing from the result is
        held by another shard.
        """
        uids = list(uids)
        _check_unique(uids)
        _check_ttl(ttl_ms)
        if not uids:
            return {}
        keys = [f"{self.prefix}token"] + [self._pod_key(u) for u in uids]
        tokens = json.loads(self._scripts["lease_acquire"](keys=keys, args=[shard, ttl_ms]))
        return {uid: t for uid, t in zip(uids, tokens) if t}

    @_translate_errors
    def renew_leases(self, tokens: Mapping[str, int], shard: str, ttl_ms: int) -> set[str]:
        """Extend to now + ``ttl_ms`` the leases held by ``shard`` with these tokens (uid -> token).

        Returns: the uids renewed. The others are lost (expired, or held with another token).
        """
        _check_ttl(ttl_ms)
        uids = list(tokens)
        if not uids:
            return set()
        done = json.loads(self._scripts["lease_renew"](
            keys=[self._pod_key(u) for u in uids], args=[shard, ttl_ms, _json([str(int(tokens[u])) for u in uids])]))
        return {uid for uid, d in zip(uids, done) if d}

    @_translate_errors
    def release_leases(self, tokens: Mapping[str, int], shard: str) -> set[str]:
        """Give up leases held by ``shard`` with these tokens (uid -> token); others are left alone.
        Reservations are not touched (see `release`). Idempotent.

        Returns: the uids released.
        """
        uids = list(tokens)
        if not uids:
            return set()
        done = json.loads(self._scripts["lease_release"](
            keys=[self._pod_key(u) for u in uids], args=[shard, _json([str(int(tokens[u])) for u in uids])]))
        return {uid for uid, d in zip(uids, done) if d}

    # Reservations

    @_translate_errors
    def reserve(self, shard: str, epoch: int, items: Sequence[ReserveItem], ttl_ms: int) -> list[ReserveResult]:
        """Reserve a batch of pods on their nodes: the second resource check, in one Redis call.

        Per pod, in batch order (earlier reservations count for later pods): the pod's lease must
        be live and held by ``shard`` with ``item.token`` (else LEASE_LOST); the node's owner must
        be ``shard`` and ``epoch`` the current shard-map epoch (else FENCED); the node must be known
        (else NODE_UNKNOWN); for every requested resource and the pod count, used + reserved +
        request <= allocatable (else INSUFFICIENT with the resource, as NodeResourcesFit orders
        them). Then the reservation is recorded with expiry server-now + ``ttl_ms``.
        Expired reservations of the batch's nodes are swept first.

        Nominations (`nominate`) of other pods whose priority is at least ``item.priority`` count
        on their node as usage (upstream ``RunFilterPluginsWithNominatedPods``): the room a
        preemption freed goes to its preemptor, not to a pod of lower or equal priority.

        Idempotent: a pod already reserved on that node by ``shard`` with that token is OK again
        (its expiry refreshed). A pod's reservation on another node is not released by this call.

        Returns: one result per item, in order.
        """
        items = list(items)
        _check_unique([it.uid for it in items])
        _check_ttl(ttl_ms)
        if not items:
            return []
        nodes = list(dict.fromkeys(it.node for it in items))
        index = {n: j for j, n in enumerate(nodes, 1)}
        keys = [f"{self.prefix}epoch", f"{self.prefix}owners"] + [self._pod_key(it.uid) for it in items]
        keys += self._node_keys(nodes) + [self._nom_key(n) for n in nodes]
        pods = [[it.uid, index[it.node], str(int(it.token)),
                 _encode_resources(ledger_requests(it.requests, it.devices), pod=True), int(it.priority)] for it in items]
        flat = json.loads(self._scripts["reserve"](keys=keys, args=[shard, int(epoch), ttl_ms, _json([nodes, pods])]))
        return [ReserveResult(it.uid, it.node, ReserveCode(flat[2 * i]), flat[2 * i + 1]) for i, it in enumerate(items)]

    @_translate_errors
    def permit(self, shard: str, epoch: int, refs: Sequence[ReservationRef], ttl_ms: int) -> dict[str, ReserveCode]:
        """Right before binding reserved pods (kube's Permit point): per pod, the lease must still be
        live and held by ``shard`` with ``ref.token`` (else LEASE_LOST), and ``shard`` must still own
        ``ref.node`` at ``epoch``, the current epoch (else FENCED); then the lease is extended to
        server-now + ``ttl_ms``, to cover the bind. One Redis call; nothing else changes.

        Returns: uid -> OK, LEASE_LOST or FENCED.
        """
        refs = list(refs)
        _check_unique([r.uid for r in refs])
        _check_ttl(ttl_ms)
        if not refs:
            return {}
        keys = [f"{self.prefix}epoch", f"{self.prefix}owners"] + [self._pod_key(r.uid) for r in refs]
        pods = [[str(int(r.token)), r.node] for r in refs]
        codes = json.loads(self._scripts["permit"](keys=keys, args=[shard, int(epoch), ttl_ms, _json(pods)]))
        return {r.uid: ReserveCode(c) for r, c in zip(refs, codes)}

    def _per_pod(self, script: str, refs: Sequence[ReservationRef]) -> dict[str, LedgerCode]:
        _check_unique([r.uid for r in refs])
        if not refs:
            return {}
        nodes = list(dict.fromkeys(r.node for r in refs))
        index = {n: j for j, n in enumerate(nodes, 1)}
        pods = [[r.uid, index[r.node], str(int(r.token))] for r in refs]
        codes = json.loads(self._scripts[script](keys=self._node_keys(nodes), args=[_json(pods)]))
        return {r.uid: LedgerCode(c) for r, c in zip(refs, codes)}

    @_translate_errors
    def commit(self, refs: Iterable[ReservationRef]) -> dict[str, LedgerCode]:
        """The pods were bound: turn each reservation made with ``token`` on ``node`` into usage
        of the node, recorded by pod uid (`ReserveItem`s can be passed as they are).

        Returns: uid -> CONVERTED (done), ALREADY (already counted: idempotent repeat, or the watch
        observed the binding first) or NOT_FOUND (no such reservation: it expired and was swept,
        was released, or replaced; count the pod with `observe`).
        """
        return self._per_pod("commit", list(refs))

    @_translate_errors
    def release(self, refs: Iterable[ReservationRef]) -> dict[str, LedgerCode]:
        """Drop reservations made with ``token`` on ``node`` (rollback after a failed Permit or
        Bind). A reservation made with another token is left alone. Idempotent; safe when
        reserve never ran.

        Returns: uid -> RELEASED or NOT_FOUND.
        """
        return self._per_pod("release", list(refs))

    # Nominations (preemption)

    def nominate(self, uid: str, node: str, priority: int, requests: Mapping[str, int],
                 victims: Sequence[str], ttl_ms: int, devices: Sequence[int] = ()) -> NominateResult:
        """One nomination (`nominate_many`)."""
        return self.nominate_many([NominateItem(uid, node, priority, requests, tuple(victims), tuple(devices))],
                                  ttl_ms)[0]

    @_translate_errors
    def nominate_many(self, items: Sequence["NominateItem"], ttl_ms: int) -> list[NominateResult]:
        """Hold preemptors' requests on their nominated nodes (kube's ``status.nominatedNodeName``)
        for ``ttl_ms`` ms of server time: `reserve` then counts them for every other pod of equal or
        lower priority. The ledger arbitrates between preemptors: a nomination is refused
        (INSUFFICIENT) unless used - (the requests of the victims of every nomination on the node,
        its own ``victims`` included, still counted bound there) + reserved + (the other
        nominations of priority >= its own) + requests <= allocatable for every resource. On
        success the node's nominations of lower priority are dropped (upstream clears them) and
        named in the result; a nomination of the same uid already there is replaced. In order,
        each recorded nomination counting for the next; one Redis call for the batch. An item's
        ``devices`` are resources of the node like the others (`device_resource`), so the check is
        per GPU device (net of the victims' shares of it) and the nomination holds its share on
        those devices only.

        Call it before deleting the victims: a refused nomination deletes nothing.

        Returns: one result per item, in order.
        """
        _check_ttl(ttl_ms)
        items = list(items)
        if not items:
            return []
        nodes = list(dict.fromkeys(it.node for it in items))
        index = {n: j for j, n in enumerate(nodes, 1)}
        keys = [k for n in nodes for k in (*self._node_keys([n]), self._nom_key(n))]
        batch = [[it.uid, index[it.node], int(it.priority),
                  _encode_resources(ledger_requests(it.requests, it.devices), pod=True), list(it.victims)]
                 for it in items]
        out = json.loads(self._scripts["nominate"](keys=keys, args=[ttl_ms, _json(batch)]))
        return [NominateResult(ReserveCode(code), detail, tuple(dropped) if isinstance(dropped, list) else ())
                for code, detail, dropped in out]

    def reserve_gang(self, epoch: int, members: Sequence[GangMember], ttl_ms: int) -> GangResult:
        """Hold one gang, all or nothing (`reserve_gangs` with one gang)."""
        return self.reserve_gangs(epoch, [members], ttl_ms)[0]

    @_translate_errors
    def reserve_gangs(self, epoch: int, gangs: Sequence[Sequence[GangMember]], ttl_ms: int) -> list[GangResult]:
        """Hold gangs on their nodes, each all or nothing, in one Redis call across the shards.

        The gangs are checked in order. Per member of a gang, in order: ``epoch`` must be the
        current shard-map epoch and ``member.shard`` the node's owner (else FENCED); no shard may
        hold a live lease of the member (else LEASE_HELD: a shard is scheduling it); the node must
        be known (else NODE_UNKNOWN); for every requested resource and the pod count, used +
        reserved + the node's nominations of other pods of priority >= the member's (those of the
        gangs held before it in this call included) + the gang's members placed on the node before
        it + request <= allocatable (else INSUFFICIENT), a member's ``devices`` checked and held as
        resources of the node (`device_resource`), one share per device. A gang's first failure writes nothing for
        that gang; the next gang is checked all the same. A gang that passes has every member
        recorded as a nomination on its node for ``ttl_ms`` ms of server time
        (`renew_nominations` extends, `unnominate` releases them), which `reserve` counts for
        every other pod of equal or lower priority: the gang's room is kept until each member is
        reserved and bound by its owner shard.

        Returns: one `GangResult` per gang, in order. Raises: ValueError for no gang, an empty
        gang or a uid named twice (in one gang or two).
        """
        gangs = [list(g) for g in gangs]
        if not gangs or not all(gangs):
            raise ValueError("a gang needs at least one member")
        members = [m for g in gangs for m in g]
        _check_unique([m.uid for m in members])
        _check_ttl(ttl_ms)
        nodes = list(dict.fromkeys(m.node for m in members))
        index = {n: j for j, n in enumerate(nodes, 1)}
        keys = [f"{self.prefix}epoch", f"{self.prefix}owners"] + [self._pod_key(m.uid) for m in members]
        keys += self._node_keys(nodes) + [self._nom_key(n) for n in nodes]
        items = [[m.uid, index[m.node], m.shard, _encode_resources(ledger_requests(m.requests, m.devices), pod=True),
                  int(m.priority)] for m in members]
        ends = list(itertools.accumulate(len(g) for g in gangs))
        out = json.loads(self._scripts["gang_reserve"](keys=keys, args=[int(epoch), ttl_ms, _json([nodes, items, ends])]))
        return [GangResult(GangCode(code), members[at - 1].uid if at else "", detail) for code, at, detail in out]

    @_translate_errors
    def renew_nominations(self, nominations: Mapping[str, str], ttl_ms: int) -> set[str]:
        """Extend nominations (uid -> node) to server-now + ``ttl_ms``. Returns the uids renewed;
        the others are gone (expired, dropped for a preemptor of higher priority, or lost with a
        Redis restart)."""
        _check_ttl(ttl_ms)
        if not nominations:
            return set()
        nodes = list(dict.fromkeys(nominations.values()))
        index = {n: j for j, n in enumerate(nodes, 1)}
        pods = [[uid, index[node]] for uid, node in nominations.items()]
        done = json.loads(self._scripts["nominate_renew"](keys=[self._nom_key(n) for n in nodes],
                                                          args=[ttl_ms, _json(pods)]))
        return {uid for uid, d in zip(nominations, done) if d}

    @_translate_errors
    def unnominate(self, nominations: Mapping[str, str]) -> dict[str, LedgerCode]:
        """Clear nominations (uid -> node): the preemptor bound, was deleted, or its nomination
        was cleared. Idempotent. Returns: uid -> RELEASED or NOT_FOUND."""
        if not nominations:
            return {}
        nodes = list(dict.fromkeys(nominations.values()))
        index = {n: j for j, n in enumerate(nodes, 1)}
        pods = [[uid, index[node]] for uid, node in nominations.items()]
        codes = json.loads(self._scripts["unnominate"](keys=[self._nom_key(n) for n in nodes], args=[_json(pods)]))
        return {uid: LedgerCode(c) for uid, c in zip(nominations, codes)}

    @_translate_errors
    def nominations(self, node: str) -> dict[str, int]:
        """The node's nominations: uid -> priority (expired ones included until dropped). For tests
        and audits."""
        return {_text(uid): int(json.loads(raw)[0]) for uid, raw in self.client.hgetall(self._nom_key(node)).items()}

    # The cluster's truth

    @_translate_errors
    def observe(self, pods: Iterable[BoundPod]) -> dict[str, LedgerCode]:
        """Count pods seen bound on the watch (by any scheduler) in their node's usage,
        idempotently by uid. A reservation of the pod on that node becomes its usage; a
        reservation on another node (the pod hash's ``rn`` pointer) is released.

        One Redis call; pods whose pointer names another node are done in a second call that
        passes that node's keys (and so on, should the pointer move meanwhile).

        Returns: uid -> ADDED (counted, no reservation), CONVERTED (counted in place of its
        reservation), ALREADY (already counted with these requests) or RESIZED (counted before
        with other requests, an in-place resize: the node's usage moves by the difference).

        Raises:
            TemporaryError: also when the pointers kept moving for 5 calls.
        """
        pending = list(pods)
        _check_unique([p.uid for p in pending])
        result: dict[str, LedgerCode] = {}
        elsewhere: dict[str, str] = {}  # uid -> node of its reservation, as the script told
        for _ in range(_OBSERVE_ATTEMPTS):
            if not pending:
                return result
            nodes = list(dict.fromkeys([p.node for p in pending] + [elsewhere[p.uid] for p in pending
                                                                    if p.uid in elsewhere]))
            index = {n: j for j, n in enumerate(nodes, 1)}
            batch = [[p.uid, index[p.node], _encode_resources(ledger_requests(p.requests, p.devices), pod=True),
                      index[elsewhere[p.uid]] if p.uid in elsewhere else 0] for p in pending]
            keys = [self._pod_key(p.uid) for p in pending] + self._node_keys(nodes)
            flat = json.loads(self._scripts["observe"](keys=keys, args=[_json([nodes, batch])]))
            moved = []
            for i, p in enumerate(pending):
                if flat[2 * i] == _OBSERVE_MOVED:
                    elsewhere[p.uid] = flat[2 * i + 1]
                    moved.append(p)
                else:
                    result[p.uid] = LedgerCode(flat[2 * i])
            pending = moved
        if pending:
            raise TemporaryError(f"observe: reservation pointers of {len(pending)} pods kept moving", delay_s=0.1)
        return result

    @_translate_errors
    def forget(self, placements: Mapping[str, str]) -> dict[str, LedgerCode]:
        """Pods deleted or terminal (uid -> node they were bound to) stop using their node; a
        reservation of the pod left on that node is dropped too. Idempotent.

        Returns: uid -> REMOVED or NOT_FOUND.
        """
        if not placements:
            return {}
        nodes = list(dict.fromkeys(placements.values()))
        index = {n: j for j, n in enumerate(nodes, 1)}
        pods = [[uid, index[node]] for uid, node in placements.items()]
        codes = json.loads(self._scripts["forget"](keys=self._node_keys(nodes), args=[_json(pods)]))
        return {uid: LedgerCode(c) for uid, c in zip(placements, codes)}

    @_translate_errors
    def reconcile(self, node: str, allocatable: Mapping[str, int],
                  bound_pods: Mapping[str, Mapping[str, int]],
                  bound_devices: Mapping[str, Sequence[int]] | None = None) -> ReconcileResult:
        """Rebuild one node's ledger from the cluster's truth: its allocatable and the pods bound
        to it (uid -> requests; ``bound_devices`` uid -> the GPU devices a pod holds). Usage
        becomes exactly those pods; their reservations and expired ones are dropped; live
        reservations of other pods are kept and the reserved counters are recomputed from them.
        The node becomes known; its owner is unchanged. Idempotent.
        """
        devices = bound_devices or {}
        args = [_encode_resources(ledger_allocatable(allocatable), pod=False)]
        for uid, requests in bound_pods.items():
            args += [uid, _encode_resources(ledger_requests(requests, tuple(devices.get(uid, ()))), pod=True)]
        drift, n_bound, n_reserved = self._scripts["reconcile"](keys=self._node_keys([node]), args=args)
        return ReconcileResult(bool(int(drift)), int(n_bound), int(n_reserved))

    @_translate_errors
    def sweep(self, nodes: Iterable[str]) -> int:
        """Drop the expired reservations of these nodes (server time). Returns how many."""
        nodes = list(dict.fromkeys(nodes))
        if not nodes:
            return 0
        return int(self._scripts["sweep"](keys=self._node_keys(nodes)))

    # Inspection and cleanup

    @_translate_errors
    def fence_views(self, items: Sequence[tuple[str, str]]) -> tuple[int, int, list[FenceView]]:
        """For (pod uid, node) pairs: (Redis server time in ms, the shard-map epoch, one `FenceView`
        per pair), read in one atomic round trip. Read-only; for audits and invariant checks."""
        pipe = self.client.pipeline(transaction=True)
        pipe.time()
        pipe.get(f"{self.prefix}epoch")
        for uid, node in items:
            pipe.hmget(self._pod_key(uid), "s", "t", "e")
            pipe.hget(f"{self.prefix}resv:{node}", uid)
            pipe.hget(f"{self.prefix}owners", node)
        replies = pipe.execute()
        seconds, micros = replies[0]
        views = []
        for i in range(len(items)):
            (holder, token, expiry), raw, owner = replies[2 + 3 * i: 5 + 3 * i]
            rec = json.loads(raw) if raw else None
            views.append(FenceView(_text(holder) if holder is not None else None,
                                   int(token) if token is not None else None,
                                   int(expiry) if expiry is not None else None,
                                   (rec[0], int(rec[1])) if rec else None,
                                   _text(owner) if owner is not None else None))
        return int(seconds) * 1000 + int(micros) // 1000, int(replies[1] or 0), views

    @_translate_errors
    def node_usage(self, node: str) -> NodeUsage:
        """A node's allocatable, used and reserved counters (expired reservations included until
        swept); all empty for an unknown node. For tests and invariant checks."""
        usage = NodeUsage({}, {}, {})
        kinds = {"a:": usage.allocatable, "u:": usage.used, "r:": usage.reserved}
        for field, value in self.client.hgetall(f"{self.prefix}node:{node}").items():
            field = _text(field)
            target = kinds.get(field[:2])
            if target is not None and int(value):
                target[field[2:]] = int(value)
        return usage

    @_translate_errors
    def reserve_volumes(self, uid: str, volumes: Sequence[str], ttl_ms: int) -> str | None:
        """Reserve ``volumes`` (``pv/<name>``, ``pvc/<namespace>/<name>``) for the pod ``uid``
        for ``ttl_ms`` ms (server time), all or none (volume_reserve.lua): two shards racing for one
        PersistentVolume, or one claim, get it once. Renews what the pod holds already.

        Returns: None when reserved, else the first volume another pod holds.
        Raises: ``ValueError`` for a TTL below 1; `TemporaryError` when Redis is away.
        """
        if ttl_ms < 1:
            raise ValueError(f"ttl_ms must be >= 1, got {ttl_ms}")
        if not volumes:
            return None
        at = int(self._scripts["volume_reserve"](keys=[f"{self.prefix}vol:{v}" for v in volumes],
                                                 args=[uid, int(ttl_ms)]))
        return None if at == 0 else volumes[at - 1]

    @_translate_errors
    def release_volumes(self, uid: str, volumes: Sequence[str]) -> int:
        """Give up the pod's reservations of ``volumes`` (those it holds; idempotent). Returns how
        many were released."""
        if not volumes:
            return 0
        return int(self._scripts["volume_release"](keys=[f"{self.prefix}vol:{v}" for v in volumes], args=[uid]))

    @_translate_errors
    def mark_binding(self, shard: str, ttl_ms: int, burst: bool = False) -> None:
        """Mark ``shard`` as having binds in flight for ``ttl_ms`` ms (server time) from now, a
        burst among them with ``burst`` (a bind call that fills its request slots), or remove its
        marks with ``ttl_ms`` 0. The marks let the Event and condition writers of every process of
        one scheduler yield to the binds of all (`shardsched.kube.gate.BindsFirst`), not only
        to those of their own process. Raises: ``ValueError`` for a negative TTL."""
        if ttl_ms < 0:
            raise ValueError(f"ttl_ms must be >= 0, got {ttl_ms}")
        self._scripts["binding_mark"](keys=[f"{self.prefix}binding", f"{self.prefix}bursting"],
                                      args=[shard, int(ttl_ms), int(bool(burst))])

    @_translate_errors
    def binding_marks(self) -> tuple[int, int]:
        """(shards with a live `mark_binding` mark, those of them marked as a burst); expired
        marks are removed."""
        binding, bursting = self._scripts["binding_any"](keys=[f"{self.prefix}binding", f"{self.prefix}bursting"])
        return int(binding), int(bursting)

    def binding_count(self) -> int:
        """How many shards have a live `mark_binding` mark (`binding_marks`' first figure)."""
        return self.binding_marks()[0]

    @_translate_errors
    def flush(self) -> int:
        """Delete every key of this ledger's prefix (SCAN + UNLINK, not atomic). Returns how many."""
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + "*"
        deleted = 0
        batch: list[str] = []
        for key in self.client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) == 500:
                deleted += self.client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += self.client.unlink(*batch)
        return deleted
