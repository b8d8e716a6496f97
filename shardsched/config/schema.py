"""The shape of a ``KubeSchedulerConfiguration`` file, field by field, with upstream defaults.

Field names are kube-scheduler's ``kubescheduler.config.k8s.io/v1`` ones (types.go in
k8s.io/kube-scheduler/config/v1); defaults are ``SetDefaults_KubeSchedulerConfiguration``
(pkg/scheduler/apis/config/v1/defaults.go) and component-base's recommended leader election
defaults; checks that involve one field or one object are here, those that need the plugin
registry are in `shardsched.config.loader`. Two additions, both shardsched's own:
``podMaxInUnschedulablePodsDurationSeconds`` (kube-scheduler's ``--pod-max-in-unschedulable-pods-duration``
flag, as a file field) and the ``shardsched`` block.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Optional

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from shardsched.config.base import ConfigModel, fail

_GO_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_DURATION_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_INT32_MAX = 2**31 - 1


def go_duration_s(text: str) -> float:
    """Seconds in a Go duration string (``"15s"``, ``"1m30s"``, ``"-1.5h"``, ``"0"``), as ``time.ParseDuration``.

    Raises:
        ValueError: not a Go duration.
    """
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.lstrip("+"))
    if body == "0":
        return 0.0
    total, pos = 0.0, 0
    for m in _GO_DURATION_PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _GO_DURATION_UNIT_S[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"{text!r} is not a duration (like 15s, 1m30s, 500ms)")
    return sign * total


def _check_duration(text: str) -> str:
    try:
        go_duration_s(text)
    except ValueError as exc:
        fail(str(exc))
    return text


GoDuration = Annotated[str, AfterValidator(_check_duration)]


class ClientConnection(ConfigModel):
    """``clientConnection``: how to reach the API server. Accepted and exposed, not interpreted here.

    Defaults as upstream: QPS 50 and burst 100 (kube-scheduler's own opinion; 0 means the default),
    protobuf content type.
    """

    kubeconfig: str = ""
    accept_content_types: str = ""
    content_type: str = "application/vnd.kubernetes.protobuf"
    qps: float = 50.0
    burst: int = 100

    @field_validator("content_type")
    @classmethod
    def _default_content_type(cls, value: str) -> str:
        return value or "application/vnd.kubernetes.protobuf"

    @field_validator("qps")
    @classmethod
    def _default_qps(cls, value: float) -> float:
        return value or 50.0

    @field_validator("burst")
    @classmethod
    def _check_burst(cls, value: int) -> int:
        if value < 0:
            fail("must be non-negative")
        return value or 100


class LeaderElection(ConfigModel):
    """``leaderElection``. Accepted and exposed, not interpreted here (shards do not elect a leader).

    Defaults as component-base's ``RecommendedDefaultLeaderElectionConfiguration`` with the
    scheduler's lock object; an empty or zero value means the default. Checked as upstream
    ``ValidateLeaderElectionConfiguration`` when ``leaderElect`` is true.
    """

    leader_elect: bool = True
    lease_duration: GoDuration = "15s"
    renew_deadline: GoDuration = "10s"
    retry_period: GoDuration = "2s"
    resource_lock: str = "leases"
    resource_name: str = "kube-scheduler"
    resource_namespace: str = "kube-system"

    @field_validator("lease_duration", "renew_deadline", "retry_period", "resource_lock",
                     "resource_name", "resource_namespace")
    @classmethod
    def _zero_is_default(cls, value: str, info: ValidationInfo) -> str:
        if not value or (info.field_name in ("lease_duration", "renew_deadline", "retry_period")
                         and go_duration_s(value) == 0):
            return cls.model_fields[info.field_name].default
        return value

    @model_validator(mode="after")
    def _check(self) -> "LeaderElection":
        if not self.leader_elect:
            return self
        durations = {"leaseDuration": self.lease_duration_s, "renewDeadline": self.renew_deadline_s,
                     "retryPeriod": self.retry_period_s}
        for field, seconds in durations.items():
            if seconds <= 0:
                fail("must be greater than zero", field)
        if self.lease_duration_s <= self.renew_deadline_s:
            fail("must be greater than renewDeadline", "leaseDuration")
        if self.resource_lock != "leases":
            fail('must be "leases"', "resourceLock")
        return self

    @property
    def lease_duration_s(self) -> float:
        return go_duration_s(self.lease_duration)

    @property
    def renew_deadline_s(self) -> float:
        return go_duration_s(self.renew_deadline)

    @property
    def retry_period_s(self) -> float:
        return go_duration_s(self.retry_period)


class ShardschedSettings(ConfigModel):
    """The ``shardsched`` block: settings kube-scheduler does not have.

    Attributes:
        max_scheduling_attempts: failed scheduling attempts after which a pod is given up on
            (``PodScheduled=False, reason=Unschedulable``, an Event, an alert metric). Default 5:
            with the default backoff (1 s doubling to 10 s) a pod has had ~15 s and several
            cluster changes to fit, which separates "briefly full" from "cannot fit as specified".
    """

    max_scheduling_attempts: int = Field(5, ge=1)


class PluginEntry(ConfigModel):
    """One ``{name, weight}`` item of an ``enabled`` or ``disabled`` list; weight 0 = not given."""

    name: str = Field(min_length=1)
    weight: int = Field(0, ge=0, le=_INT32_MAX)


class PluginSetSpec(ConfigModel):
    enabled: list[PluginEntry] = Field(default_factory=list)
    disabled: list[PluginEntry] = Field(default_factory=list)


class PluginsSpec(ConfigModel):
    """``plugins``: one set per extension point, plus ``multiPoint``."""

    pre_enqueue: PluginSetSpec = PluginSetSpec()
    queue_sort: PluginSetSpec = PluginSetSpec()
    pre_filter: PluginSetSpec = PluginSetSpec()
    filter: PluginSetSpec = PluginSetSpec()
    post_filter: PluginSetSpec = PluginSetSpec()
    pre_score: PluginSetSpec = PluginSetSpec()
    score: PluginSetSpec = PluginSetSpec()
    reserve: PluginSetSpec = PluginSetSpec()
    permit: PluginSetSpec = PluginSetSpec()
    pre_bind: PluginSetSpec = PluginSetSpec()
    bind: PluginSetSpec = PluginSetSpec()
    post_bind: PluginSetSpec = PluginSetSpec()
    multi_point: PluginSetSpec = PluginSetSpec()

    def by_point(self) -> dict[str, PluginSetSpec]:
        """The sets keyed by their YAML names (``preFilter``, ``multiPoint``, ...)."""
        return {info.alias: getattr(self, name) for name, info in type(self).model_fields.items()}


class PluginConfigSpec(ConfigModel):
    """One ``pluginConfig`` item; ``args`` is validated against the plugin's args type later."""

    name: str = Field(min_length=1)
    args: Optional[dict[str, Any]] = None


class ProfileSpec(ConfigModel):
    scheduler_name: Optional[str] = None
    plugins: PluginsSpec = PluginsSpec()
    plugin_config: list[PluginConfigSpec] = Field(default_factory=list)
    percentage_of_nodes_to_score: Optional[int] = Field(None, ge=0, le=100)


class FileSpec(ConfigModel):
    """A whole ``KubeSchedulerConfiguration`` document.

    ``enableProfiling``, ``enableContentionProfiling`` and ``delayCacheUntilActive`` are accepted
    for compatibility and have no effect; ``extenders`` must be empty (shardsched has none).
    """

    api_version: str
    kind: str
    profiles: list[ProfileSpec] = Field(default_factory=list)
    #: None (unset) = score every feasible node (shardsched's default); 0 = kube's adaptive rule
    percentage_of_nodes_to_score: Optional[int] = Field(None, ge=0, le=100)
    pod_initial_backoff_seconds: float = Field(1.0, gt=0)
    pod_max_backoff_seconds: float = 10.0
    pod_max_in_unschedulable_pods_duration_seconds: float = Field(300.0, gt=0)
    parallelism: int = Field(16, gt=0, le=_INT32_MAX)
    client_connection: ClientConnection = ClientConnection()
    leader_election: LeaderElection = LeaderElection()
    enable_profiling: bool = True
    enable_contention_profiling: bool = True
    delay_cache_until_active: bool = False
    extenders: list[dict[str, Any]] = Field(default_factory=list)
    shardsched: ShardschedSettings = ShardschedSettings()

    @field_validator("extenders")
    @classmethod
    def _no_extenders(cls, extenders: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if extenders:
            fail("shardsched does not support scheduler extenders; use its plugins")
        return extenders

    @model_validator(mode="after")
    def _check_backoff(self) -> "FileSpec":
        if self.pod_max_backoff_seconds < self.pod_initial_backoff_seconds:
            fail("must be greater than or equal to podInitialBackoffSeconds", "podMaxBackoffSeconds")
        return self
