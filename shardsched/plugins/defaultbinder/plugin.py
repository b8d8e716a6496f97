"""DefaultBinder: binds through the cluster client of the framework's `Handle` (``pods/binding``
on a real API server), as kube's DefaultBinder: one ``bind_many`` call for the batch. A pod that
takes GPU devices has them in the Binding's ``metadata.annotations`` (`DEVICES_ANNOTATION`,
``"0,3"``), which the API server sets on the pod in the update that binds it (docs/gpu.md).

Per pod: 201 is Success; any other answer is an Error whose message is ``"<code> <message>"``,
and its ``(code, message)`` is kept in ``state[RESULTS_KEY]`` (uid -> pair) for the caller to tell
a conflict (409, 404: bound by someone else, or deleted) from a server error (5xx). A 504, or a call
that raised (no answer: a broken connection), may have been applied: its uid also goes to
``state[BIND_OUTCOME_UNKNOWN_KEY]``; for a call that raised, the code is 504 and the message the
exception's."""

from __future__ import annotations

from typing import Sequence

from shardsched.api.objects import PodInfo
from shardsched.errors import TemporaryError
from shardsched.cache.devices import DEVICES_ANNOTATION, format_devices
from shardsched.framework.cycle_state import BIND_OUTCOME_UNKNOWN_KEY, DEVICES_KEY, CycleState
from shardsched.framework.interface import BindPlugin, Handle
from shardsched.framework.status import Status

NAME = "DefaultBinder"
#: key of uid -> (HTTP code, message) of the pods whose bind failed
RESULTS_KEY = NAME + "/failed"
#: the answer taken for a bind call that raised: its outcome is unknown, as a timeout's
NO_ANSWER = 504


class DefaultBinder(BindPlugin):
    name = NAME

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def bind(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[Status]:
        """Bind pod ``i`` to ``nodes[i]`` in one call (module docstring). Never raises."""
        failed: dict[str, tuple[int, str]] = state.setdefault(RESULTS_KEY, {})
        unknown: set[str] = state.setdefault(BIND_OUTCOME_UNKNOWN_KEY, set())
        client = self.handle.client
        if client is None:
            st = Status.error("no cluster to bind to", plugin=NAME)
            return [st] * len(pods)
        try:
            results = client.bind_many(self._bindings(state, pods, nodes))
        except TemporaryError as e:
            return self._no_answer(pods, str(e), failed, unknown)
        except Exception as e:  # noqa: BLE001 - a broken connection to the cluster must not lose pods
            return self._no_answer(pods, f"{type(e).__name__}: {e}", failed, unknown)
        out = []
        ok = Status.success()
        for p, r in zip(pods, results):
            if r.code == 201:
                out.append(ok)
                continue
            failed[p.uid] = (r.code, r.message)
            if r.code == NO_ANSWER:
                unknown.add(p.uid)
            out.append(Status.error(f"{r.code} {r.message}", plugin=NAME))
        return out

    def _bindings(self, state: CycleState, pods: Sequence[PodInfo], nodes: Sequence[str]) -> list[tuple]:
        """One request per pod; a pod given GPU devices (``state[DEVICES_KEY]``, else the table's)
        carries them in the Binding's annotations, `DEVICES_ANNOTATION`."""
        chosen = state.get(DEVICES_KEY) or {}
        table = self.handle.table
        out = []
        for p, n in zip(pods, nodes):
            devices = chosen.get(p.uid) or (table.devices_of(p.uid) if table is not None else ())
            if devices:
                out.append((p.namespace, p.name, n, p.uid, {DEVICES_ANNOTATION: format_devices(devices)}))
            else:
                out.append((p.namespace, p.name, n, p.uid))
        return out

    @staticmethod
    def _no_answer(pods: Sequence[PodInfo], why: str, failed: dict, unknown: set) -> list[Status]:
        st = Status.error(why, plugin=NAME)
        for p in pods:
            failed[p.uid] = (NO_ANSWER, why)
            unknown.add(p.uid)
        return [st] * len(pods)


def new(args=None, handle: Handle | None = None) -> DefaultBinder:
    return DefaultBinder(handle or Handle())
