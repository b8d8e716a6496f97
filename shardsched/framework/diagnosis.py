"""Diagnosis: why a pod fits no node, as kube-scheduler's ``framework.Diagnosis`` and ``FitError``.

A failed scheduling attempt records, per node, the code of the first Filter that rejected it
(``Unschedulable`` or ``UnschedulableAndUnresolvable``: kube's ``NodeToStatusMap`` reduced to what
PostFilter reads, as bool arrays over NodeTable slots), the reasons counted over nodes (the ``0/N nodes are available: ...`` histogram),
the plugins that rejected some node (``UnschedulablePlugins``, which decide the cluster events that
move the pod back to activeQ), and, for a PreFilter rejection, that plugin's message
(``PreFilterMsg``). PostFilter (preemption) adds its own message (``PostFilterMsg``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: kube's framework.NoNodeAvailableMsg
NO_NODE_AVAILABLE_MSG = "0/{n} nodes are available"


def fit_error_message(num_nodes: int, reasons: dict[str, int]) -> str:
    """kube's FitError message: ``0/N nodes are available: <count> <reason>, ....`` (the
    ``"<count> <reason>"`` strings sorted, as upstream's ``sortReasonsHistogram``)."""
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    return f"0/{num_nodes} nodes are available: {', '.join(parts)}."


@dataclass(slots=True)
class Diagnosis:
    """Why a pod fits no node (kube's ``Diagnosis``).

    Attributes:
        num_all_nodes: nodes looked at (kube's ``FitError.NumAllNodes``).
        reasons: reason -> number of nodes rejected with it (a node may count under several).
        rejected: bool array over the table's slots [0, n): the nodes some Filter rejected; None when
            PreFilter rejected the pod (every node then has PreFilter's status).
        unresolvable: bool array over the same slots: the rejected nodes whose rejection is
            UnschedulableAndUnresolvable (preemption cannot help there); the others are Unschedulable.
            None with ``rejected`` None: then ``pre_filter_unresolvable`` says it for every node.
        unschedulable_plugins: names of the plugins that rejected some node, in profile order.
        pre_filter_msg: the PreFilter plugin's message when PreFilter rejected the pod on every node.
        post_filter_msg: PostFilter's message (``preemption: ...``), "" when PostFilter said nothing.
    """

    num_all_nodes: int
    reasons: dict[str, int] = field(default_factory=dict)
    rejected: np.ndarray | None = None
    unresolvable: np.ndarray | None = None
    unschedulable_plugins: tuple[str, ...] = ()
    pre_filter_msg: str = ""
    pre_filter_unresolvable: bool = True
    post_filter_msg: str = ""

    def message(self) -> str:
        """kube's ``FitError.Error()``: ``0/N nodes are available: <PreFilter message or the reason
        histogram>.`` then `` <PostFilter message>.`` when there is one (upstream's separator
        ``" %v."`` gives the double period of ``...=Never..``)."""
        head = NO_NODE_AVAILABLE_MSG.format(n=self.num_all_nodes) + ":"
        if self.pre_filter_msg:
            head += f" {self.pre_filter_msg}."
        else:
            head += " " + ", ".join(sorted(f"{c} {r}" for r, c in self.reasons.items())) + "."
        if self.post_filter_msg:
            head += f" {self.post_filter_msg}."
        return head
