"""Status and Code: the outcome of a plugin call, as kube-scheduler's framework.Status.

Plugins return a Status for expected outcomes instead of raising; the framework, not the plugin,
records which plugin rejected a pod.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardsched.framework.diagnosis import Diagnosis


class Code(enum.IntEnum):
    """kube-scheduler's status codes (framework/interface.go)."""

    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5
    PENDING = 6


@dataclass(frozen=True, slots=True)
class Status:
    """A plugin's outcome: a code, human reasons, and the plugin that produced it; a failed
    scheduling attempt's Status carries its `Diagnosis` (kube's ``FitError``)."""

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""
    diagnosis: "Diagnosis | None" = field(default=None, compare=False)

    @classmethod
    def success(cls) -> "Status":
        return _SUCCESS

    @classmethod
    def skip(cls) -> "Status":
        return _SKIP

    @classmethod
    def unschedulable(cls, *reasons: str, plugin: str = "", resolvable: bool = True) -> "Status":
        code = Code.UNSCHEDULABLE if resolvable else Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        return cls(code, tuple(reasons), plugin)

    @classmethod
    def error(cls, message: str, plugin: str = "") -> "Status":
        return cls(Code.ERROR, (message,), plugin)

    def is_success(self) -> bool:
        return self.code == Code.SUCCESS

    def is_skip(self) -> bool:
        return self.code == Code.SKIP

    def is_rejected(self) -> bool:
        """Unschedulable, UnschedulableAndUnresolvable or Pending (upstream IsRejected)."""
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE, Code.PENDING)

    @property
    def message(self) -> str:
        return ", ".join(self.reasons)


_SUCCESS = Status()
_SKIP = Status(Code.SKIP)
