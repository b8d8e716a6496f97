"""An actor of ``shardsched run`` that dies and cannot be replaced: the simulated cluster mid-run
(killed from outside, as a user's ``kill -9`` would), the coordinator while the run starts. The
run ends with one line naming what died, the summary of what was seen until then, and exit status
5; no traceback. And a pod deleted while its condition is written is no error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from shardsched.cli.run import EXIT_DIED, exit_status
from shardsched.config import load_config
from shardsched.sharding.calls import ActorFailed
from shardsched.sharding.sim_actor import sim_cluster_actor
from shardsched.sharding.embedded import EmbeddedRun
from shardsched.sharding.run_control import RunOptions
from shardsched.sim import uniform_nodes, uniform_pods

CLI = [sys.executable, "-m", "shardsched.cli.main"]
CONFIG = load_config(None)
#: a run that lasts well over ten seconds on 2 cores: small batches, each bind call answered in 200 ms
SLOW_RUN = ["--nodes", "20", "--pods", "2000", "--pod-cpu", "10m", "--pod-memory", "10Mi", "--max-batch-size", "10",
            "--bind-latency-ms", "200", "-o", "json", "--timeout", "300"]


def _actor_process(parent: int, cls: str, timeout_s: float = 60.0) -> psutil.Process:
    """The process of a Ray actor of class ``cls`` (its title is ``ray::cls...``) under ``parent``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in psutil.Process(parent).children(recursive=True):
            try:
                if " ".join(p.cmdline()).startswith(f"ray::{cls}"):
                    return p
            except psutil.Error:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no ray::{cls} process under {parent}")


def test_the_simulated_cluster_killed_mid_run_ends_it_with_one_line_a_summary_and_status_5(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    run = subprocess.Popen(CLI + ["run", *SLOW_RUN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, env=env, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any(line.startswith("note: Ray at ") for line in lines):
            assert run.poll() is None and time.monotonic() < deadline, "".join(lines)[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # pods bind
        _actor_process(run.pid, "SimClusterHost").send_signal(signal.SIGKILL)
        out = run.stdout.read()
        run.wait(180)
    finally:
        if run.poll() is None:
            run.kill()
    reader.join(10)
    err = "".join(lines)
    assert run.returncode == EXIT_DIED, err[-3000:]
    assert "Traceback" not in err and "ActorDiedError" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the simulated cluster died ") and last.endswith(
        " s into the run; the summary counts what was seen until then"), err[-3000:]
    data = json.loads(out)
    assert data["died"] == last[len("error: "):-len("; the summary counts what was seen until then")]
    assert data["pods_bound"] + data["pods_unschedulable"] + data["pods_pending"] + data["pods_deleted_unbound"] \
        + data["lost_pods"] == data["pods_total"] == 2000
    assert 0 < data["pods_bound"] < 2000
    assert "the counts are those of the cluster's last sample, before it died" in data["errors"]


class _CoordinatorKilledAtStart(EmbeddedRun):
    """The coordinator is killed once it has started and before the run meters its shards: the
    last step of the start-up."""

    def _meter_shards(self) -> None:
        self.coordinator.channel.terminate()  # ray.kill, no restart
        # ray.kill returns before the actor is gone: wait until a call sees it dead, so that the
        # start-up's own next call meets a dead coordinator (not one that dies later in the run)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.coordinator.pid().wait(5)
            except ActorFailed:
                break
            time.sleep(0.05)
        super()._meter_shards()


def test_the_coordinator_killed_during_start_up_is_said_and_exits_5(redis_server, ray_session):
    nodes = uniform_nodes(4)
    workload = [(0.0, None, p) for p in uniform_pods(10, cpu="100m", memory="100Mi", scheduler_name=CONFIG.profiles[0].scheduler_name)]
    report = _CoordinatorKilledAtStart(CONFIG, nodes, workload, RunOptions(redis_url=redis_server.url, timeout_s=60,
                                                                           coordinator_name=None)).run()
    assert report.died == "the coordinator died while the run started"
    assert not report.started and exit_status(report) == EXIT_DIED
    assert ray_session.is_initialized()  # the session's Ray is left running


def test_a_condition_for_a_pod_deleted_meanwhile_is_no_error(ray_session):
    """The coordinator writes PodScheduled=False fire and forget; a trace replay may have deleted
    the pod already: the cluster answers False (nothing changed), not an error nobody reads
    (Ray's "Unhandled error" on stderr)."""
    cluster = sim_cluster_actor()
    try:
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}
        assert ray_session.get(cluster.set_pod_condition.remote("default", "gone", condition)) is False
    finally:
        ray_session.kill(cluster)

