"""PNG charts of benchmark results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def image_formats() -> list[str]:
    """File name extensions matplotlib can write (``png``, ``svg``, ``pdf``, ...), sorted."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def bars(path: str, labels: Sequence[str], values: Sequence[float], ylabel: str, title: str,
         reference: Sequence[float | None] | None = None, reference_label: str = "") -> str:
    """One bar per label; ``reference`` (optional, None = no mark) is drawn as a black tick per bar
    (e.g. an upstream threshold). Returns ``path``."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.5))
    xs = range(len(labels))
    ax.bar(xs, values, color="tab:blue", label="measured")
    if reference is not None:
        pts = [(x, r) for x, r in zip(xs, reference) if r is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="_", s=600, color="black",
                       label=reference_label, zorder=3)
            ax.legend()
    ax.set_xticks(list(xs), labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def lines(path: str, x: Sequence[float], series: dict[str, Sequence[float]], xlabel: str, title: str,
          logx: bool = False, secondary: dict[str, Sequence[float]] | None = None, ylabel: str = "",
          secondary_label: str = "", xticklabels: Sequence[str] | None = None) -> str:
    """Lines over ``x``; ``secondary`` series go on a right-hand axis. Returns ``path``."""
    plt = _pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, ys in series.items():
        ax.plot(x, ys, marker="o", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if logx:
        ax.set_xscale("log")
    if xticklabels is not None:
        ax.set_xticks(list(x), list(xticklabels))
    handles, labels = ax.get_legend_handles_labels()
    if secondary:
        ax2 = ax.twinx()
        for name, ys in secondary.items():
            ax2.plot(x, ys, marker="s", linestyle="--", color="tab:red", label=name)
        ax2.set_ylabel(secondary_label)
        ax2.set_ylim(bottom=0)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


#: the resources the run's plot shows as requested / allocatable, when the cluster has them
TIMELINE_RESOURCES = (("cpu", "CPU"), ("memory", "memory"), ("nvidia.com/gpu", "GPUs (whole)"),
                      ("alibabacloud.com/gpu-milli", "GPU capacity (thousandths)"))


#: the run's plot shows the bind rate in at most about this many bars
RATE_BINS = 60


def run_timeline(path: str, report, period_s: float) -> str:
    """The course of a ``shardsched run`` (a `RunReport` with at least 2 samples), three panels over
    seconds since the workload started, every curve from the same samples of the simulated cluster
    (one every ``period_s``): pods bound per second (between consecutive samples, or over a few
    of them, to show at most `RATE_BINS` bars); every pod of the
    workload in the summary's categories, stacked (they add up to the workload at every moment);
    requested / allocatable of CPU, memory and GPUs (those the cluster has). Grey marks the time
    the workload was being created (a burst's few seconds, a replay's whole span); a dotted line
    marks the last bind. Returns ``path``; OSError when it cannot be written."""
    import numpy as np

    plt = _pyplot()
    s = report.samples
    t = np.array([x.t_s for x in s])
    total = report.pods_total
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    # at most ~RATE_BINS bars, each over a whole number of samples (a long replay's single binds average out)
    step = max(1, round((t[-1] - t[0]) / RATE_BINS / period_s))
    edges = sorted(set(range(0, len(s), step)) | {len(s) - 1})
    bound = np.array([s[i].bound for i in edges], float)
    rate = np.diff(bound) / np.maximum(np.diff(t[edges]), 1e-9)
    axes[0].stairs(rate, t[edges], fill=True, color="tab:blue", alpha=0.8)
    axes[0].set_ylabel("pods bound / s" if step == 1 else f"pods bound / s\n(mean over {step * period_s:g} s)")
    states = [
        ("not created yet", [total - x.created for x in s], "lightgrey"),
        ("queued or in flight", [x.queued for x in s], "tab:orange"),
        ("unschedulable", [x.unschedulable for x in s], "tab:red"),
        ("bound" if not report.replay else "bound, running", [x.running for x in s], "tab:green"),
        ("bound, then deleted", [x.deleted_bound for x in s], "darkseagreen"),
        ("deleted before bound", [x.deleted_unbound for x in s], "tab:purple"),
    ]
    shown = [st for st in states if any(st[1])]
    axes[1].stackplot(t, *[st[1] for st in shown], labels=[st[0] for st in shown], colors=[st[2] for st in shown])
    axes[1].set_ylabel("pods")
    axes[1].set_ylim(0, max(1, total))
    axes[1].legend(loc="center right", fontsize="small", title="pending = not created + queued", title_fontsize="small")
    for resource, label in TIMELINE_RESOURCES:
        alloc = report.allocatable.get(resource, 0)
        if alloc:
            axes[2].plot(t, [100 * x.requested.get(resource, 0) / alloc for x in s], label=label)
    axes[2].set_ylabel("requested / allocatable (%)")
    axes[2].set_ylim(0, 100)
    axes[2].legend(loc="upper left", fontsize="small")
    axes[2].set_xlabel(f"seconds since the workload started (one sample every {period_s:g} s)")
    first, last = report.created_first_s, report.created_last_s
    for i, ax in enumerate(axes):
        if first is not None:
            ax.axvspan(first, max(last, first + period_s / 4), color="grey", alpha=0.15, lw=0,
                       label="pods being created" if i == 0 else None)
        ax.axvline(report.schedule_wall_s, color="black", ls=":", lw=1, label="last bind" if i == 0 else None)
        ax.set_xlim(0, t[-1])
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    kind = "trace replay" if report.replay else "burst"
    fig.suptitle(f"shardsched run: {report.nodes} nodes, {total} pods ({kind}), {report.shards_label} shards")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
