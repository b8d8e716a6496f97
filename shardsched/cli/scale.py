"""``shardsched scale``: change the number of shards of a running shardsched (``run`` or ``serve``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time

import click

from shardsched.cli import FiniteFloat
from shardsched.errors import ShardschedError
from shardsched.sharding.rayaccess import refused_hint
from shardsched.sharding.scaling import COORDINATOR_NAME, RAY_NAMESPACE


#: exit statuses of ``scale`` (its --help lists them)
EXIT_OK = 0
EXIT_FAILED = 1
#: interrupted: 128 + the signal's number, as shells report it (130 SIGINT, 143 SIGTERM)
EXIT_SIGNAL_BASE = 128

_stderr_fd = 2  # where `_end` writes (see `scale`)


@click.command()
@click.option("--shards", type=click.IntRange(1, 64), default=None,
              help="The new shard count. Without it: show the current count and the steps so far.")
@click.option("--ray-address", default=None,
              help="The Ray cluster where shardsched runs, HOST:PORT as `shardsched run` prints it (default: auto, "
                   "the Ray started last on this machine, or the head of the Ray pod it runs in).")
@click.option("--name", default=COORDINATOR_NAME, show_default=True,
              help=f"The coordinator's Ray actor name (Ray namespace: {RAY_NAMESPACE}).")
@click.option("--timeout", "timeout_s", type=FiniteFloat(0, min_open=True), default=600.0, show_default=True,
              help="Give up after this many seconds in all: joining Ray, finding the coordinator and the step "
                   "(new shards may wait for Ray to add a worker).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="The step (or the status) as a line, or as JSON.")
def scale(shards: int | None, ray_address: str | None, name: str, timeout_s: float, output: str) -> None:
    """Add or remove shards of a running shardsched, without stopping it.

    \b
    Joins the Ray cluster, finds the coordinator (a named actor, started by `shardsched run` and
    `shardsched serve`) and asks it for --shards shards. Rendezvous hashing moves about the ideal
    share of the nodes; the new owners are published with a new epoch before anything else, so a
    shard that has not caught up is refused by the ledger (FENCED) and its pods are routed again;
    removed shards hand back their queued pods, then stop. Prints the step: nodes moved (and the
    ideal fraction), pods routed again, how long it took.

    \b
    `shardsched run` prints the Ray address to pass and where its authentication token is. Ray's
    token is read from $RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token, and
    sent also with --ray-address (Ray itself sends it only without one).

    \b
    With the autoscaler on (`run --autoscale`), the count set here holds until its next decision.
    Exit status: 0 on success; 1 when Ray or the coordinator cannot be reached (a refused token
    included), the step failed, or nothing answered within --timeout; 130 on SIGINT, 143 on SIGTERM.
    """
    # Ray's calls can block for minutes in its own code (joining a GCS that went away, retrying a
    # refused token), where neither a timeout nor a signal reaches them: they run in a thread, and
    # this one waits for it, within --timeout, and ends the process on a signal
    global _stderr_fd
    _stderr_fd = os.dup(2)  # stderr itself, while `_KeptLog.kept` holds file descriptor 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    outcome: list = []
    joined = threading.Event()
    ray_log = _KeptLog()
    worker = threading.Thread(target=lambda: outcome.append(_ask(ray_address, name, shards, timeout_s, joined, ray_log)),
                              name="scale", daemon=True)
    deadline = time.monotonic() + timeout_s
    worker.start()
    handlers_again = False
    while worker.is_alive():
        if joined.is_set() and not handlers_again:
            # Ray's core worker installs a native SIGTERM handler of its own once it has joined
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, _on_signal)
            handlers_again = True
        if time.monotonic() > deadline:
            where = ray_address or "auto"
            if joined.is_set():
                _end(EXIT_FAILED, f"error: the coordinator did not answer within --timeout {timeout_s:g} s")
            if ray_log.refused():
                _end(EXIT_FAILED, f"error: {refused_hint(where)}")
            _end(EXIT_FAILED, f"error: Ray at {where} could not be joined within --timeout {timeout_s:g} s "
                              "(has the run ended?)")
        worker.join(0.1)
    code, message = outcome[0] if outcome else (EXIT_FAILED, "error: scale ended without an answer")
    if code != EXIT_OK:
        _end(code, message)
    result = message
    if output == "json":
        click.echo(json.dumps(result, indent=2))
    elif shards is None:
        auto = ", autoscaler on" if result["autoscaler"] else ""
        click.echo(f"{result['shards']} shards (epoch {result['epoch']}{auto}), {result['pending']} pods pending")
        for step in result["steps"]:
            click.echo(describe(step))
    else:
        click.echo(describe(result))
    _end(EXIT_OK, "")


def _on_signal(signum: int, frame) -> None:
    _end(EXIT_SIGNAL_BASE + signum, f"interrupted ({signal.Signals(signum).name})")


def _end(code: int, message: str) -> None:
    """Print ``message`` on stderr and end the process now, with ``code``: Ray's threads may be
    blocked in a call that would keep a normal exit (its shutdown) waiting."""
    sys.stdout.flush()
    sys.stderr.flush()
    if message:
        os.write(_stderr_fd, f"{message}\n".encode())
    os._exit(code)


def _ask(ray_address: str | None, name: str, shards: int | None, timeout_s: float, joined: threading.Event,
         ray_log: "_KeptLog") -> tuple[int, object]:
    """Join Ray (what Ray prints meanwhile kept in ``ray_log``), find the coordinator ``name`` and
    ask for the step (or the status); sets ``joined`` once Ray is joined. Returns (`EXIT_OK`, the
    result) or (an exit status, the error line)."""
    from shardsched.cli import check_ray_address
    from shardsched.sharding.actors import NoRayError, find_coordinator
    from shardsched.sharding.calls import MethodFailed, NoAnswer

    try:
        check_ray_address(ray_address)
        with ray_log.kept():
            try:
                coordinator = find_coordinator(ray_address, name)
            except NoRayError as e:
                return EXIT_FAILED, f"error: {e}; when it runs on another machine, pass --ray-address HOST:PORT"
            except ShardschedError as e:
                if ray_log.refused():
                    return EXIT_FAILED, f"error: {refused_hint(ray_address or 'auto')}"
                return EXIT_FAILED, f"error: {e}"
    except ShardschedError as e:
        return EXIT_FAILED, f"error: {e}"
    joined.set()
    try:
        if shards is None:
            deadline = time.monotonic() + timeout_s
            asked = coordinator.status(), coordinator.scale_history()
            status, history = (reply.wait(max(0.0, deadline - time.monotonic())) for reply in asked)
            return EXIT_OK, {"shards": status["shards"], "epoch": status["epoch"], "pending": status["pending"],
                             "autoscaler": status.get("autoscaler", False), "steps": history}
        return EXIT_OK, coordinator.scale(shards).wait(timeout_s)
    except NoAnswer as e:
        return EXIT_FAILED, f"error: the coordinator did not answer: {e.kind}"
    except MethodFailed as e:
        return EXIT_FAILED, f"error: scaling failed: {e.cause if e.cause is not None else e}"
    except ShardschedError as e:  # the coordinator's own (a new shard did not start in time, ...)
        return EXIT_FAILED, f"error: scaling failed: {e}"


class _KeptLog:
    """What is written to file descriptor 2 while `kept` is entered (Ray's core prints a line a
    second there while a GCS refuses its token or does not answer), held in a temporary file
    instead of reaching the terminal."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()

    @contextlib.contextmanager
    def kept(self):
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        try:
            yield self
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)

    def refused(self) -> bool:
        """Whether Ray refused this process's authentication token (``InvalidAuthToken``)."""
        return b"InvalidAuthToken" in os.pread(self.file.fileno(), 1 << 20, 0)


def describe(step: dict) -> str:
    """One line for a scale step (`ScaleStep.to_json`)."""
    if step["from_shards"] == step["to_shards"]:
        n = step["to_shards"]
        return f"already {n} shard{'' if n == 1 else 's'}: nothing to do"
    return (f"shards {step['from_shards']} -> {step['to_shards']} ({step['trigger']}, epoch {step['epoch']}): "
            f"{step['nodes_moved']} of {step['nodes']} nodes moved ({step['moved_fraction']:.3f}, ideal "
            f"{step['ideal_fraction']:.3f}), {step['pods_rerouted']} queued pods routed again; new shards started in "
            f"{step['start_s']:.2f} s, handover {step['handover_s']:.3f} s")
