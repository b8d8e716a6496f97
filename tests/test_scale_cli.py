"""``shardsched scale`` from another terminal, against a real ``shardsched run`` in a subprocess
(its own local Ray, with Ray's default token authentication): the run says how to reach it,
``scale`` reaches it that way, says exactly what is missing when its token is not sent, ends
within its --timeout when the run ends meanwhile, and honours SIGTERM (exit 143)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

TRACE = Path(__file__).parent / "data" / "alibaba-slice"
CLI = [sys.executable, "-m", "shardsched.cli.main"]
#: a trace replay that lasts minutes (the test ends it with SIGTERM)
LONG_RUN = ["run", "--trace", str(TRACE / "openb_pod_list_default.csv"), "--trace-nodes",
            str(TRACE / "openb_node_list_all_node.csv"), "--time-scale", "20000", "--timeout", "900", "-o", "json"]


def terminal_env(**extra: str) -> dict[str, str]:
    """The environment of a new terminal: none of the Ray settings this test session's own Ray
    put into its environment (``ray.init`` sets ``RAY_AUTH_MODE=token`` for its children)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(extra)
    return env


def scale(*args: str, timeout_s: float = 120.0, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(CLI + ["scale", *args], capture_output=True, text=True, timeout=timeout_s,
                          env=terminal_env(**env))
    return proc, time.monotonic() - started


def test_scale_reaches_a_run_from_another_terminal_and_ends_within_its_timeout(tmp_path):
    run = subprocess.Popen(CLI + LONG_RUN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                           env=terminal_env(), start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stderr), daemon=True)
    reader.start()
    stopped = False
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("note: Ray at ") for line in lines):
            assert run.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        note = next(line for line in lines if line.startswith("note: Ray at "))
        address = note.split()[3]
        token = Path.home() / ".ray" / "auth_token"
        assert note == (f"note: Ray at {address} (token authentication, token in {token}); from another terminal: "
                        f"shardsched scale --ray-address {address} --shards N\n")

        # the command the run printed works from a terminal that has none of the run's environment
        step, _ = scale("--ray-address", address, "--shards", "3", "-o", "json")
        assert step.returncode == 0, step.stderr[-3000:]
        assert (json.loads(step.stdout)["from_shards"], json.loads(step.stdout)["to_shards"]) == (2, 3)

        # no token sent: one line saying what is missing (once Ray gives up its retries, ~20 s), none
        # of Ray's own lines; and, in a second terminal meanwhile, SIGTERM while Ray's retries go
        # on: exit 143 at once
        started = time.monotonic()
        refusing = subprocess.Popen(CLI + ["scale", "--ray-address", address, "--timeout", "90"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=terminal_env(RAY_AUTH_MODE="disabled"))
        waiting = subprocess.Popen(CLI + ["scale", "--ray-address", address, "--timeout", "120"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=terminal_env(RAY_AUTH_MODE="disabled"))
        time.sleep(8)  # imported, joining
        assert waiting.poll() is None
        waiting.send_signal(signal.SIGTERM)
        _, err = waiting.communicate(timeout=10)
        assert waiting.returncode == 143 and err == "interrupted (SIGTERM)\n"

        _, refused = refusing.communicate(timeout=120)
        took_s = time.monotonic() - started
        assert refusing.returncode == 1
        assert refused == (f"error: Ray at {address} requires its authentication token, and RAY_AUTH_MODE=disabled "
                           "here sends none: unset RAY_AUTH_MODE\n")
        assert took_s < 90 + 20  # the process's start (imports) comes on top of --timeout

        # the run ends while scale retries: scale still ends within its --timeout
        retrying = subprocess.Popen(CLI + ["scale", "--ray-address", address, "--shards", "2", "--timeout", "20"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=terminal_env(RAY_AUTH_MODE="disabled"))
        started = time.monotonic()
        time.sleep(8)
        run.send_signal(signal.SIGTERM)
        stopped = True
        _, err = retrying.communicate(timeout=60)
        assert retrying.returncode == 1 and err.count("\n") == 1 and err.startswith("error: "), err
        assert time.monotonic() - started < 20 + 20
    finally:
        if not stopped:
            run.send_signal(signal.SIGTERM)
        out = run.stdout.read()
        run.wait(120)
    assert run.returncode == 143, "".join(lines)[-3000:]
    assert json.loads(out)["interrupted"] == "SIGTERM"

    # the run is gone: said at once, not after minutes of retries
    gone, took_s = scale("--ray-address", address, "--timeout", "600")
    assert gone.returncode == 1 and took_s < 30
    assert gone.stderr == f"error: --ray-address {address}: no Ray head answers there (Connection refused)\n"
