"""Where the time goes: py-spy on every process of an embedded run, summarized per process.

`Profiler` starts ``py-spy record -p PID -f raw --gil`` on the driver, the simulated cluster, the
coordinator and each shard as soon as the run has started them, and stops them (SIGINT: py-spy then
writes its file) when the run ends. ``--gil`` keeps only samples of the thread holding the GIL, i.e.
Python work, not waits in Ray's C++ loop, on sockets or on locks, which py-spy's idle detection does
not always recognize. `summarize` reads one raw file: the share of samples per leaf function
("self"), and per *shardsched function nearest the leaf* (a numpy, Redis or Ray call is charged to
the shardsched code that made it), which is the view that says which of our steps costs what.

Profiling costs CPU (py-spy itself, on a 2-core machine), so a profiled run's throughput is not
quoted; its shares are.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

#: processes not worth profiling with py-spy (not Python)
SKIP_LABELS = {"redis"}


class Profiler:
    """py-spy recorders for one run (see module docstring); a no-op when py-spy is not installed."""

    def __init__(self, directory: str | os.PathLike[str], row: str, rate_hz: int = 100) -> None:
        self.directory = Path(directory)
        self.row = row.replace("/", "_")
        self.rate_hz = rate_hz
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.available = shutil.which("py-spy") is not None
        self.errors: list[str] = [] if self.available else ["py-spy not found on PATH: not profiled"]

    def attach(self, labels: dict[int, str]) -> None:
        """Start a recorder for each (pid -> label) not yet recorded."""
        if not self.available:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for pid, label in labels.items():
            if label in SKIP_LABELS or label in self.procs:
                continue
            out = self.directory / f"{self.row}.{label}.txt"
            proc = subprocess.Popen(["py-spy", "record", "-p", str(pid), "-f", "raw", "--gil", "-r", str(self.rate_hz),
                                     "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.procs[label] = (proc, out)

    def stop(self) -> dict[str, dict[str, Any]]:
        """Stop every recorder (SIGINT, then wait) and summarize each file: label -> summary."""
        out = {}
        for label, (proc, path) in self.procs.items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for label, (proc, path) in self.procs.items():
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if path.is_file() and path.stat().st_size:
                out[label] = {"file": str(path), **summarize(path)}
            else:
                self.errors.append(f"{label}: py-spy wrote nothing ({(err or b'').decode(errors='replace').strip()[-200:]})")
        return out


def _frame(text: str) -> tuple[str, str]:
    """``"name (path/file.py:123)"`` -> (name, path)."""
    name, _, rest = text.partition(" (")
    return name, rest.rsplit(":", 1)[0] if rest else ""


def _short(name: str, path: str) -> str:
    parts = Path(path).parts
    if "shardsched" in parts:
        path = "/".join(parts[parts.index("shardsched"):])
    else:
        path = Path(path).name
    return f"{name} ({path})"


def summarize(path: str | os.PathLike[str], top: int = 10) -> dict[str, Any]:
    """Summary of a py-spy raw file: ``samples`` (non-idle), ``self`` and ``by_shardsched_frame``:
    lists of (function, share of samples in [0, 1]) sorted by share, at most ``top`` each."""
    leaf: Counter = Counter()
    ours: Counter = Counter()
    total = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [_frame(x) for x in stack.split(";") if x]
            if not frames:
                continue
            total += n
            leaf[_short(*frames[-1])] += n
            mine = next((fr for fr in reversed(frames) if "shardsched" in Path(fr[1]).parts), None)
            ours[_short(*mine) if mine else "(no shardsched frame: Ray/Python runtime)"] += n

    def shares(c: Counter) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in c.most_common(top)] if total else []

    return {"samples": total, "self": shares(leaf), "by_shardsched_frame": shares(ours)}


def markdown(row: str, profiles: dict[str, dict[str, Any]], cpu_s_by_process: dict[str, float], top: int = 6) -> str:
    """A "where the time goes" section for one run: per process its CPU seconds and top frames."""
    lines = [f"#### where the time goes: {row}", ""]
    for label, cpu in sorted(cpu_s_by_process.items(), key=lambda kv: -kv[1]):
        prof = profiles.get(label)
        lines.append(f"- **{label}**: {cpu:.2f} CPU s" + (f", {prof['samples']} samples" if prof else " (not profiled)"))
        if prof:
            for name, share in prof["by_shardsched_frame"][:top]:
                lines.append(f"  - {100 * share:.0f}% {name}")
    return "\n".join(lines) + "\n"
