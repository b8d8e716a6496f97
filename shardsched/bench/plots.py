"""PNG charts of benchmark results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
