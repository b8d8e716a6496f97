"""A preemption's API writes as one batch (`ClusterBackend.prepare_candidates`): for each preemptor
that won its node, upstream's ``prepareCandidate`` (every victim's ``DisruptionTarget`` condition,
its deletion with a uid precondition, a ``Preempted`` Event) and then the preemptor's own failure
record (``FailedScheduling`` Event, ``PodScheduled=False`` and ``status.nominatedNodeName``, which
upstream's ``handleSchedulingFailure`` writes after a PostFilter that nominated a node).

`prepare_candidate` writes one candidate through a backend's own per-object methods; the
simulated cluster runs it for the whole batch in one call, the Kubernetes backend runs the
candidates of a batch concurrently (each one's writes in order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from shardsched.cluster.errors import ApiError, Conflict, NotFound
from shardsched.errors import TemporaryError


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod to evict: ``uid`` is the delete's precondition."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One preemptor's writes: the pod (namespace, name, uid, its ``scheduler_name`` for the
    ``DisruptionTarget`` message), its nominated ``node``, the ``victims`` to delete there, and the
    FailedScheduling ``message`` of its attempt ("" writes no Event or PodScheduled condition)."""

    namespace: str
    name: str
    uid: str
    scheduler_name: str
    node: str
    victims: tuple[Victim, ...]
    message: str = ""


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """What `prepare_candidate` did for one `Candidate`.

    Attributes:
        gone: uids of the victims deleted, or found gone already (404) or re-created under their
            name (409, the uid precondition): they hold the node no more, or not for long.
        failed_victim: ``namespace/name`` of the victim that could not be deleted ("" when none);
            the candidate's writes stopped there (no nominatedNodeName, no FailedScheduling).
        error: that victim's error, ``"<ApiError class>: <message>"`` (e.g. ``"Forbidden: ..."``).
        status_error: the preemptor's own status write failed (it was deleted meanwhile): the
            error's words, "" when written.
    """

    gone: tuple[str, ...] = ()
    failed_victim: str = ""
    error: str = ""
    status_error: str = ""


def _words(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def prepare_candidate(backend: Any, c: Candidate) -> CandidateResult:
    """Write one candidate through ``backend``'s ``set_disruption_target``, ``delete_pod``,
    ``record_event``, ``set_pod_condition`` and ``set_nominated_node_name``: first every victim's
    condition, then (none failed) every delete with its uid precondition, a ``Preempted`` Event
    (``Preempted by pod <uid> on node <node>``) per victim gone, then the preemptor's
    FailedScheduling Event, its PodScheduled condition and nominatedNodeName. A 404 or 409 counts
    as gone; any other `ApiError` or `TemporaryError` stops the candidate there (upstream's
    ``prepareCandidate`` stops on the first error too). Never raises those."""
    gone: list[str] = []
    live: list[Victim] = []
    for v in c.victims:
        try:
            backend.set_disruption_target(v.namespace, v.name, c.scheduler_name)
            live.append(v)
        except (NotFound, Conflict):
            gone.append(v.uid)
        except (ApiError, TemporaryError) as e:
            return CandidateResult(tuple(gone), v.key, _words(e))
    failed = error = ""
    for v in live:
        try:
            backend.delete_pod(v.namespace, v.name, v.uid, None)
        except (NotFound, Conflict):
            pass
        except (ApiError, TemporaryError) as e:
            failed, error = failed or v.key, error or _words(e)
            continue
        gone.append(v.uid)
    for v in c.victims:
        if v.uid in gone:
            backend.record_event({"kind": "Pod", "namespace": v.namespace, "name": v.name, "uid": v.uid}, "Normal",
                                 "Preempted", f"Preempted by pod {c.uid} on node {c.node}")
    if failed:
        return CandidateResult(tuple(gone), failed, error)
    try:
        if c.message:
            backend.record_event({"kind": "Pod", "namespace": c.namespace, "name": c.name, "uid": c.uid}, "Warning",
                                 "FailedScheduling", c.message)
            backend.set_pod_condition(c.namespace, c.name, {"type": "PodScheduled", "status": "False",
                                                            "reason": "Unschedulable", "message": c.message})
        backend.set_nominated_node_name(c.namespace, c.name, c.node)
    except (ApiError, TemporaryError) as e:
        return CandidateResult(tuple(gone), status_error=_words(e))
    return CandidateResult(tuple(gone))


def prepare_candidates(backend: Any, candidates: Sequence[Candidate]) -> list[CandidateResult]:
    """`prepare_candidate` for each, in order: one `CandidateResult` per candidate."""
    return [prepare_candidate(backend, c) for c in candidates]
