"""Chaos scenarios as data: the YAML files in ``chaos/scenarios/`` and their validation.

A scenario says what to run (cluster, workload, shards, Redis, the API's bind behaviour), what to
break and when (a fault schedule of ``{at_s, action, args}`` steps, optionally repeated), for how
long at most, which invariants of the design (`INVARIANTS`) must hold, and which counters prove
that the faults really happened (``exercised``: a scenario whose fault never fired proves nothing).
A ``short:`` block overrides any of these for CI: the settings sections (`SETTINGS`) key by key,
anything else (``faults``, ``exercised``, ``duration_s``, ...) whole.

Field names are snake_case with their unit (``at_s``, ``latency_ms``), as the fault schedule of the
chaos suite's brief names them. Validation errors name the field path
(``faults[2].args.latency_ms: required``), after the ``short:`` merge when it applies.

Times are seconds from the start of the workload (when the first pod is created).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shardsched.api.quantity import canonical_quantity
from shardsched.config.base import error_lines
from shardsched.errors import ShardschedError
from shardsched.sim import FaultConfig

SCENARIO_DIR = Path(__file__).parent / "scenarios"

#: the invariants of docs/design.md, by the name a scenario lists them with
INVARIANTS = {
    "no_overcommit": "1. no node's bound pods exceed its allocatable (no admission rejection of a pod we bound)",
    "no_double_bind": "2a. no pod is bound twice",
    "no_stale_token_bind": "2b. no bind is applied under a stale lease/fencing token",
    "no_lost_pods": "3. every pod ends bound, or pending with a reason (the run settles)",
    "shard_recovery": "4. a killed shard's pods are bound elsewhere within lease TTL + 5 s",
    "ledger_converges": "5. the Redis ledger equals the cluster's truth after the faults",
    "spread_holds": "6. pods with a DoNotSchedule zone spread end within its maxSkew (when the workload has one)",
    "gangs_whole": "7. every gang ends fully bound or with no member bound (when the workload has gangs)",
    "preemption_bounded": "6b. a preemptor deletes no more victims than kube's rules need and none twice, and binds "
                          "in bounded time: no preemption loop (when the scenario has a `preemption` block)",
}


class ScenarioError(ShardschedError):
    """A scenario file is missing or invalid; the message names the field path of each problem."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------------------- parts


class ClusterSpec(_Model):
    """Identical nodes (`shardsched.sim.uniform_nodes`); with ``zones`` > 0 they are labelled
    ``topology.kubernetes.io/zone: z0 .. z<zones-1>`` in turn."""

    nodes: int = Field(gt=0)
    cpu: str = "8"
    memory: str = "16Gi"
    max_pods: int = Field(110, gt=0)
    zones: int = Field(0, ge=0)


class WorkloadSpec(_Model):
    """Identical pods of our scheduler. ``arrival_rate_per_s`` 0 is a burst (all created at once);
    otherwise pods arrive evenly at that rate, so the throughput before, during and after a fault
    is comparable."""

    pods: int = Field(gt=0)
    cpu: str = "500m"
    memory: str = "512Mi"
    arrival_rate_per_s: float = Field(0.0, ge=0)
    #: every pod gets a DoNotSchedule spread over the zones with this maxSkew (None: none); no
    #: shard can check it alone, so the coordinator nominates each pod's node
    zone_spread_max_skew: int | None = Field(None, ge=1)
    #: the pods form gangs of this many (PodGroups with minMember = gang_size, their profile with
    #: Coscheduling, docs/gangs.md); ``pods`` must be a multiple of it (None: no gangs)
    gang_size: int | None = Field(None, ge=1)
    #: the pods' ``spec.priority`` (None: unset, priority 0)
    priority: int | None = None
    #: seconds after the start when the first pod arrives (the replica sets fill the nodes first)
    start_s: float = Field(0.0, ge=0)


#: the name (and ``app`` label) of a scenario's replica sets, ``chaos-low-<i>``; their pods are
#: ``default/chaos-low-<i>-<5 characters>``
REPLICA_SET_APP = "chaos-low"


class ReplicaSetsSpec(_Model):
    """``sets`` ReplicaSet-like sets of the simulated cluster (`SimCluster.create_replica_set`),
    made when the run starts, ``replicas`` pods each of our scheduler: as the ReplicaSet controller
    does, a set replaces a pod of its that is deleted (a preemption's victim) at once with a new
    one, which competes for the room the victim left. These pods are the background of the
    workload: invariant 4 (``shard_recovery``) does not count them, since a victim's replacement
    stays pending by design when the nodes are full; the other invariants do."""

    sets: int = Field(1, ge=1)
    replicas: int = Field(gt=0)
    cpu: str = "1"
    memory: str = "1Gi"
    priority: int = 0
    termination_grace_period_s: int = Field(0, ge=0)


class PreemptionSpec(_Model):
    """What invariant 6b (``preemption_bounded``, docs/design.md's 6) allows: the workload's pods
    are the preemptors, each must bind within ``bound_within_s`` of its creation. The victims each
    may delete are computed from the specs (`minimum_victims`)."""

    bound_within_s: float = Field(gt=0)


class ShardsSpec(_Model):
    count: int = Field(2, ge=1, le=16)
    lease_ttl_s: float = Field(3.0, gt=0)
    reservation_ttl_s: float = Field(3.0, gt=0)
    batch_size: int = Field(0, ge=0)
    max_batch_size: int = Field(1000, ge=1)
    #: binding cycles in the background per shard (`ShardOptions.binding_cycles`; serve runs 2)
    binding_cycles: int = Field(0, ge=0, le=8)


class RedisSpec(_Model):
    """``appendonly``: the runner's Redis keeps an AOF (``appendfsync everysec``). ``proxy``: the
    shards and the coordinator reach Redis through two `chaos.proxy.FaultProxy` (one each; required
    by redis-latency and partition-redis). The auditor and the runner's checks go direct."""

    appendonly: bool = False
    proxy: bool = False


class BindsSpec(_Model):
    """The simulated API's bind behaviour from the start (`shardsched.sim.FaultConfig`)."""

    latency_s: float = Field(0.0, ge=0)
    jitter_s: float = Field(0.0, ge=0)
    error_rate: float = Field(0.0, ge=0, le=1)
    conflict_rate: float = Field(0.0, ge=0, le=1)
    timeout_rate: float = Field(0.0, ge=0, le=1)
    timeout_applied_fraction: float = Field(0.5, ge=0, le=1)

    def fault_config(self) -> FaultConfig:
        return FaultConfig(bind_latency_s=self.latency_s, bind_jitter_s=self.jitter_s,
                           bind_error_rate=self.error_rate, bind_conflict_rate=self.conflict_rate,
                           bind_timeout_rate=self.timeout_rate, timeout_applied_fraction=self.timeout_applied_fraction)

    @model_validator(mode="after")
    def _rates(self) -> "BindsSpec":
        if self.error_rate + self.conflict_rate + self.timeout_rate > 1:
            raise ValueError("error_rate + conflict_rate + timeout_rate must be <= 1")
        return self


# ----------------------------------------------------------------------------- fault arguments


class KillShardArgs(_Model):
    """SIGKILL a shard actor's process (``os.kill(pid, SIGKILL)``). ``index`` None: the k-th kill of
    this step takes shard k mod the shard count."""

    index: int | None = Field(None, ge=0)


class KillCoordinatorArgs(_Model):
    """SIGKILL the coordinator actor's process; the run's supervisor starts a new one that adopts
    the running shards."""


class RestartRedisArgs(_Model):
    """Stop Redis (SIGKILL when ``crash``, else SIGTERM) and start it again after ``down_s``."""

    crash: bool = True
    down_s: float = Field(0.0, ge=0)


Who = Literal["shards", "coordinator", "all"]


class RedisLatencyArgs(_Model):
    """Add ``latency_ms`` to every chunk between ``who`` and Redis, each way, for ``for_s``."""

    latency_ms: float = Field(gt=0)
    for_s: float = Field(gt=0)
    who: Who = "shards"


class PartitionRedisArgs(_Model):
    """Cut ``who`` off Redis (connections reset, new ones refused) for ``for_s``."""

    for_s: float = Field(gt=0)
    who: Who = "shards"


class ReplaceShardArgs(_Model):
    """The coordinator replaces shard ``index`` by a new incarnation while the old one keeps running
    (as when its health checks time out in a network partition): two owners of the same nodes."""

    index: int = Field(0, ge=0)


class FreezeShardArgs(_Model):
    """SIGSTOP shard ``index`` for ``for_s``, then SIGCONT: long enough and the coordinator replaces
    it, and the old one wakes up as a stale owner in the middle of whatever it was doing."""

    index: int = Field(0, ge=0)
    for_s: float = Field(gt=0)


class BindFaultsArgs(BindsSpec):
    """Change the API's bind behaviour (`BindsSpec`) for ``for_s`` (None: for the rest of the run)."""

    for_s: float | None = Field(None, gt=0)


class DeletePodsArgs(_Model):
    """Delete ``count`` of our pods at random, among those ``state`` selects."""

    count: int = Field(gt=0)
    state: Literal["pending", "bound", "any"] = "any"


class DeleteNodesArgs(_Model):
    """Delete ``count`` nodes at random, with their pods (as the pod GC controller does)."""

    count: int = Field(gt=0)


class AddNodesArgs(_Model):
    count: int = Field(gt=0)


class RivalArgs(_Model):
    """A second scheduler binding its own pods onto the first ``nodes`` nodes, ``rate_per_s`` pods
    a second, ``pods`` in all, at random nodes. ``mode: ledger``: it reserves in the ledger first as
    the node's owner would (so the ledger arbitrates); ``bypass``: it binds straight to the cluster
    (only the kubelet-like admission catches an overcommit)."""

    mode: Literal["ledger", "bypass"]
    pods: int = Field(gt=0)
    rate_per_s: float = Field(gt=0)
    nodes: int = Field(gt=0)
    cpu: str = "500m"
    memory: str = "512Mi"


ACTIONS: dict[str, type[_Model]] = {
    "kill-shard": KillShardArgs,
    "kill-coordinator": KillCoordinatorArgs,
    "restart-redis": RestartRedisArgs,
    "redis-latency": RedisLatencyArgs,
    "partition-redis": PartitionRedisArgs,
    "replace-shard": ReplaceShardArgs,
    "freeze-shard": FreezeShardArgs,
    "bind-faults": BindFaultsArgs,
    "delete-pods": DeletePodsArgs,
    "delete-nodes": DeleteNodesArgs,
    "add-nodes": AddNodesArgs,
    "rival": RivalArgs,
}
Action = Literal[tuple(ACTIONS)]  # type: ignore[valid-type]


class FaultStep(_Model):
    """One step of the schedule: ``action`` with ``args`` at ``at_s``; with ``every_s`` it repeats
    ``count`` times in all."""

    at_s: float = Field(ge=0)
    action: Action
    args: dict[str, Any] = Field(default_factory=dict)
    every_s: float | None = Field(None, gt=0)
    count: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _repeat(self) -> "FaultStep":
        if self.count > 1 and self.every_s is None:
            raise ValueError("count > 1 needs every_s")
        return self

    def parsed_args(self) -> _Model:
        return ACTIONS[self.action].model_validate(self.args)

    def times_s(self) -> list[float]:
        return [self.at_s + k * (self.every_s or 0.0) for k in range(self.count)]


class Scenario(_Model):
    """A chaos scenario (see module docstring)."""

    name: str
    description: str = ""
    seed: int = 0
    duration_s: float = Field(gt=0, description="deadline: the run must settle by then")
    cluster: ClusterSpec
    workload: WorkloadSpec
    shards: ShardsSpec = ShardsSpec()
    redis: RedisSpec = RedisSpec()
    binds: BindsSpec = BindsSpec()
    replica_sets: ReplicaSetsSpec | None = None
    preemption: PreemptionSpec | None = None
    faults: list[FaultStep] = Field(default_factory=list)
    invariants: list[Literal[tuple(INVARIANTS)]] = Field(default_factory=lambda: list(INVARIANTS))  # type: ignore[valid-type]
    #: verdict counter (dotted path) -> minimum value that shows the faults happened
    exercised: dict[str, float] = Field(default_factory=dict)
    short: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        needs_proxy = {"redis-latency", "partition-redis"} & {f.action for f in self.faults}
        if needs_proxy and not self.redis.proxy:
            raise ValueError(f"{', '.join(sorted(needs_proxy))} needs redis.proxy: true")
        if self.workload.gang_size is not None and self.workload.pods % self.workload.gang_size:
            raise ValueError("workload.pods must be a multiple of workload.gang_size")
        if self.workload.zone_spread_max_skew is not None and self.cluster.zones < 1:
            raise ValueError("workload.zone_spread_max_skew needs cluster.zones >= 1")
        if self.preemption is not None:
            if self.replica_sets is None:
                raise ValueError("preemption needs replica_sets (the pods the workload preempts)")
            if (self.workload.priority or 0) <= self.replica_sets.priority:
                raise ValueError("preemption needs workload.priority above replica_sets.priority")
        return self

    def minimum_victims(self) -> int:
        """Victims one preemptor needs on a node that holds only replica-set pods, as many as fit
        (the scenario's nodes are filled so): enough of them gone for the preemptor's cpu, memory
        and pod count. kube's rules never delete more (they reprieve every pod that can stay)."""
        c, rs, w = self.cluster, self.replica_sets, self.workload
        node = (canonical_quantity("cpu", c.cpu), canonical_quantity("memory", c.memory), c.max_pods)
        low = (canonical_quantity("cpu", rs.cpu), canonical_quantity("memory", rs.memory), 1)
        high = (canonical_quantity("cpu", w.cpu), canonical_quantity("memory", w.memory), 1)
        fit = min(n // v for n, v in zip(node, low))
        return max(0, *(-(-(h - (n - fit * v)) // v) for n, v, h in zip(node, low, high)))


# ------------------------------------------------------------------------------------- loading


#: sections a ``short:`` block overrides key by key; any other key it names is replaced whole
SETTINGS = ("cluster", "workload", "shards", "redis", "binds", "replica_sets", "preemption")


def _merge_short(base: dict[str, Any], short: dict[str, Any]) -> dict[str, Any]:
    """The document with its ``short:`` block applied (`SETTINGS` merged key by key)."""
    out = {k: v for k, v in base.items() if k != "short"}
    for k, v in short.items():
        if k in SETTINGS and isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def scenario_path(name_or_path: str | Path) -> Path:
    """The file of a scenario given by name (``shard-kill``) or path.

    Raises:
        ScenarioError: no such scenario (the message lists the known ones).
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    path = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(p.stem for p in sorted(SCENARIO_DIR.glob("*.yaml")))
        raise ScenarioError(f"no scenario {str(name_or_path)!r} (known: {known})")
    return path


def parse_scenario(data: Any, short: bool = False, where: str = "scenario") -> Scenario:
    """Validate a scenario document (a mapping); with ``short``, its ``short:`` block merged in first.

    Raises:
        ScenarioError: the problems, one per line, each as ``field.path: what``.
    """
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: a scenario is a mapping, got {type(data).__name__}")
    if short:
        override = data.get("short")
        if not isinstance(override, dict):
            raise ScenarioError(f"{where}: short: a mapping is required to run the short version")
        data = _merge_short(data, override)
        where += " (with its short: block)"
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        raise _error(where, error_lines(exc)) from None
    problems = []
    for i, step in enumerate(scenario.faults):
        try:
            step.parsed_args()
        except ValidationError as exc:
            problems += error_lines(exc, ("faults", i, "args"))
    if problems:
        raise _error(where, problems)
    return scenario


def load_scenario(name_or_path: str | Path, short: bool = False) -> Scenario:
    """Load and validate a scenario by name or path (see `parse_scenario`)."""
    path = scenario_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not YAML: {e}") from None
    return parse_scenario(data, short, str(path))


def list_scenarios() -> list[Scenario]:
    """Every scenario of ``chaos/scenarios/``, by name."""
    return [load_scenario(p) for p in sorted(SCENARIO_DIR.glob("*.yaml"), key=lambda p: p.stem)]


def _error(where: str, problems: list[tuple[str, str]]) -> ScenarioError:
    lines = "\n".join(f"  {path or '(document)'}: {msg}" for path, msg in problems)
    return ScenarioError(f"{where} is invalid:\n{lines}")
