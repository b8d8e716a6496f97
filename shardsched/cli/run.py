"""``shardsched run``: the main job, embedded (local Ray, local Redis, simulated cluster)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import click

from shardsched.cli import (FiniteFloat, Quantity, autoscale_options, autoscaler_from, check_port_free, check_ray_address,
                            MAX_BATCH_SIZE_HELP, SEED_HELP, check_redis, output_console, redis_url_option)
from shardsched.errors import ConfigError, ShardschedError

#: exit statuses of ``run`` (its --help and the README list them)
EXIT_OK = 0
EXIT_FAILED = 1  # could not start (Redis, Ray, a config or trace file), or the plot could not be written
EXIT_INVARIANT = 3
EXIT_TIMEOUT = 4
#: an actor the run cannot replace died: the simulated cluster, or the coordinator while the run started
EXIT_DIED = 5
#: interrupted: 128 + the signal's number, as shells report it (130 SIGINT, 143 SIGTERM)
EXIT_SIGNAL_BASE = 128



def _parse_scale_at(ctx: click.Context, param: click.Parameter, value: str | None) -> list[tuple[float, int]]:
    """``--scale-at "T:N,T:N"`` -> [(T seconds, N shards)]."""
    steps = []
    for part in (value or "").split(","):
        if not part.strip():
            continue
        try:
            at, n = part.split(":")
            step = (float(at), int(n))
        except ValueError:
            raise click.BadParameter(f"{part.strip()!r} is not T:N (seconds:shards)") from None
        if step[0] < 0 or not 1 <= step[1] <= 64:
            raise click.BadParameter(f"{part.strip()!r}: T must be >= 0 and N in [1, 64]")
        steps.append(step)
    return steps


def _plot_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--plot``: an image format matplotlib writes (by the name's extension), in a folder that
    exists and is writable (and the file, if there), checked before the run rather than after it."""
    if value is None:
        return None
    from shardsched.bench.plots import image_formats

    extension = os.path.splitext(value)[1].lstrip(".").lower()
    formats = image_formats()
    if extension not in formats:
        given = f"'.{extension}' is not an image format matplotlib writes" if extension else "the name has no extension"
        raise click.BadParameter(f"{value!r}: {given}; use one of .{', .'.join(formats)}")
    folder = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{value!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(value) and not os.access(value, os.W_OK)):
        raise click.BadParameter(f"{value!r}: not writable")
    return value


@click.command()
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True, help="Nodes of the simulated cluster.")
@click.option("--node-cpu", type=Quantity("cpu"), default="8", show_default=True, help="Allocatable CPU per node.")
@click.option("--node-memory", type=Quantity("memory"), default="16Gi", show_default=True,
              help="Allocatable memory per node.")
@click.option("--node-pods", type=click.IntRange(1), default=110, show_default=True, help="Allocatable pods per node.")
@click.option("--pods", type=click.IntRange(0), default=20000, show_default=True, help="Pods in the burst.")
@click.option("--pod-cpu", type=Quantity("cpu"), default="1", show_default=True, help="CPU request per pod.")
@click.option("--pod-memory", type=Quantity("memory"), default="1Gi", show_default=True, help="Memory request per pod.")
@click.option("--shards", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Shard actors (each schedules the pods routed to it on the nodes it owns).")
@click.option("--scale-at", callback=_parse_scale_at, metavar="T:N[,T:N...]",
              help="Change the shard count during the run: at T seconds after the workload starts, to N shards "
                   "(e.g. 2:4,5:2). `shardsched scale --shards N` does the same from another terminal.")
@autoscale_options(autoscale_note=" (--shards is the count at start)")
@click.option("--batch-size", type=click.IntRange(0), default=0, show_default=True,
              help="Pods per batch; 0 = adaptive (everything ready, up to --max-batch-size).")
@click.option("--max-batch-size", type=click.IntRange(1), default=1000, show_default=True,
              help=MAX_BATCH_SIZE_HELP)
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="KubeSchedulerConfiguration file; pods use its first profile's schedulerName.")
@click.option("--trace", "trace_pods", type=click.Path(dir_okay=False),
              help="Replay a pod list of the Alibaba GPU trace (CSV) instead of the burst.")
@click.option("--trace-nodes", type=click.Path(dir_okay=False),
              help="Node list of the Alibaba GPU trace (CSV); required with --trace.")
@click.option("--gpu-aggregate", is_flag=True,
              help="With --trace and no --config: count GPUs per node in aggregate (alibabacloud.com/gpu-milli "
                   "summed over the node's devices), a relaxation that lets a share straddle two devices; the "
                   "default checks each device (the GPUDevice plugin, docs/gpu.md).")
@click.option("--trace-limit", type=click.IntRange(1), default=None,
              help="With --trace: replay only the first N trace pods.")
@click.option("--time-scale", type=FiniteFloat(0, min_open=True), default=None,
              help="With --trace: time compression, trace seconds per replay second, uniform (default: derived from "
                   "the trace so that every pod lives long enough to be scheduled, idle pauses shortened; the run "
                   "says how, and how long the replay takes).")
@click.option("--redis-url", callback=redis_url_option, help="Use this Redis (redis://[:password@]host:port/db) instead of starting one.")
@click.option("--ray-address", help="Join this Ray cluster instead of starting a local one.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), help="Serve Prometheus metrics on 127.0.0.1:PORT.")
@click.option("--bind-latency-ms", type=FiniteFloat(0), default=0.0, show_default=True,
              help="Simulated API latency per bind call.")
@click.option("--bind-error-rate", type=FiniteFloat(0, 1), default=0.0, show_default=True,
              help="Fraction of binds answered 500 by the simulated API.")
@click.option("--seed", type=int, default=0, show_default=True,
              help=SEED_HELP)
@click.option("--timeout", "timeout_s", type=FiniteFloat(0, min_open=True), default=600.0, show_default=True,
              help="Give up after this many seconds of scheduling (exit status 4 when pods are still pending).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), callback=_plot_path,
              help="Write the run's course to this image (PNG, SVG, PDF, ... by its extension): pods bound per "
                   "second, every pod's state, and CPU/memory/GPU requested, sampled every 0.25 s.")
def run(**kw) -> None:
    """Run the scheduler on an embedded simulated cluster and report how it did.

    \b
    Everything starts here and stops on exit: a local Ray instance, a private redis-server on
    127.0.0.1 (the ledger of reservations and leases), the simulated cluster (with the API server's
    409/404 semantics and a kubelet-like admission that exposes any overcommit), a coordinator and
    --shards shard actors.

    \b
    Default scenario, from the field report: 5,000 nodes of 8 CPU / 16Gi / 110 pods and a burst of
    20,000 pods of 1 CPU / 1Gi. With --trace/--trace-nodes it replays the Alibaba GPU trace instead.

    \b
    The summary gives this run's figures, each with what it measures: bound/unschedulable/pending
    (each pod counted once), latency from pod creation to bound, pods bound per second over the
    scheduling window (first pod created to last pod bound), CPU cores, memory, requeues, replaced
    shards, coordinator restarts; a replay's also says how many pods were deleted before and after
    binding and the peak share of CPU, memory and GPUs requested. Then the invariants:
    overcommitted nodes, double binds and lost pods must be 0. `shardsched bench field` compares
    with kube-scheduler's one-pod loop on the same cluster and pods. If the embedded
    redis-server exits, it is started again (same port and password), the ledger is rebuilt from
    the cluster, and the summary says so. Ctrl-C (SIGINT) or SIGTERM stops the run in order and
    prints the summary of what was done (nothing but a line when it came during start-up).

    \b
    Exit status:
      0    every pod bound or unschedulable, invariants hold
      1    could not start (Redis, Ray, config or trace file), or the plot could not be written
      2    bad command-line usage (an option's value, or options that do not fit together)
      3    an invariant was violated
      4    timed out (--timeout) with pods pending
      5    the simulated cluster died, or the coordinator while the run started (one line says
           which; the summary counts what was seen until then)
      130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM (128 + the signal's number)
    """
    try:  # imports (Ray's), files, workload: a Ctrl-C here comes before the run's own handlers
        config, nodes, workload, options = _prepare(kw)
    except KeyboardInterrupt:
        click.echo("interrupted during start-up (SIGINT); nothing was scheduled", err=True)
        sys.exit(EXIT_SIGNAL_BASE + signal.SIGINT)
    from shardsched.sharding.embedded import EmbeddedRun
    from shardsched.sharding.run_control import RunError

    show_progress = kw["output"] == "table" and sys.stderr.isatty()
    try:
        with _stdout_to_stderr(kw["output"] == "json"):
            report = _execute(EmbeddedRun, config, nodes, workload, options, show_progress)
    except RunError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_FAILED)
    code = exit_status(report)
    if not report.started:
        what = f"error: {report.died}" if report.died else f"interrupted during start-up ({report.interrupted})"
        click.echo(f"{what}; nothing was scheduled", err=True)
        sys.exit(code)
    if kw["output"] == "json":
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_summary(report)
    if report.died:
        click.echo(f"error: {report.died}; the summary counts what was seen until then", err=True)
    if kw["plot_path"]:
        try:
            _plot(report, kw["plot_path"])
        except OSError as e:
            click.echo(f"error: --plot {kw['plot_path']}: could not write the plot: {getattr(e, 'strerror', None) or e}",
                       err=True)
            code = code or EXIT_FAILED
    sys.exit(code)



def _prepare(kw: dict):
    """The configuration, nodes, workload and `RunOptions` of ``run``'s arguments, with the checks
    that need no Ray (Redis and Ray addresses answer). Exits with status 1 after one ``error:`` line
    when something is wrong."""
    from shardsched.config import load_config
    from shardsched.sharding.run_control import RunOptions
    from shardsched.sharding.shard import ShardOptions
    from shardsched.sim.cluster import FaultConfig

    try:
        config = load_config(_config_source(kw))
        nodes, workload, notes = _workload(kw, config.profiles[0].scheduler_name)
        if kw["trace_pods"] and not any(p.name == "GPUDevice" for p in config.profiles[0].enabled("filter")):
            notes.append("the profile has no GPUDevice Filter: GPUs are counted per node in aggregate, a relaxation "
                         "that lets a GPU share straddle two devices (docs/gpu.md)")
        autoscaler = autoscaler_from(kw)
        if kw["metrics_port"]:
            check_port_free("--metrics-port", kw["metrics_port"])
        if kw["redis_url"]:
            check_redis(kw["redis_url"])
        check_ray_address(kw["ray_address"])
    except (ConfigError, ShardschedError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_FAILED)
    for note in notes:
        click.echo(f"warning: {note}", err=True)
    time_scale, max_pause_s, bind_wait_s = kw["time_scale"] or 1.0, None, None
    if kw["trace_pods"]:
        plan = _trace_replay(workload, kw["time_scale"], kw["timeout_s"])
        time_scale, max_pause_s, bind_wait_s = plan.time_scale, plan.max_pause_s, plan.bind_wait_s
    faults = None
    if kw["bind_latency_ms"] or kw["bind_error_rate"]:
        faults = FaultConfig(bind_latency_s=kw["bind_latency_ms"] / 1000, bind_error_rate=kw["bind_error_rate"])
    options = RunOptions(
        shards=kw["shards"],
        shard_options=ShardOptions(batch_size=kw["batch_size"], max_batch_size=kw["max_batch_size"], seed=kw["seed"]),
        redis_url=kw["redis_url"], ray_address=kw["ray_address"], faults=faults, seed=kw["seed"],
        timeout_s=kw["timeout_s"], time_scale=time_scale, trace_max_pause_s=max_pause_s, trace_bind_wait_s=bind_wait_s,
        metrics_port=kw["metrics_port"],
        scale_at=kw["scale_at"], autoscaler=autoscaler,
    )
    return config, nodes, workload, options


def exit_status(report) -> int:
    """``run``'s exit status for a report (the table in ``run --help``): an actor that died comes
    first (the counts are then partial), then an invariant violated, an interruption (128 + the
    signal's number), a timeout."""
    if report.died:
        return EXIT_DIED
    data = report.to_json()
    if data["overcommitted_nodes"] or data["admission_rejections"] or data["double_binds"] or data["lost_pods"]:
        return EXIT_INVARIANT
    if report.interrupted:
        return EXIT_SIGNAL_BASE + signal.Signals[report.interrupted].value
    if report.timed_out:
        return EXIT_TIMEOUT
    return EXIT_OK


def _trace_replay(workload, given: float | None, timeout_s: float):
    """The replay's `ReplayCompression`: ``given`` as a uniform time scale, else the default derived
    from the trace (`replay_compression`: every pod lives at least `MIN_REPLAY_LIFETIME_S`). Says on
    stderr how long the replay takes and why, and warns when that is longer than --timeout, or when
    pods live shorter than `MIN_REPLAY_LIFETIME_S` at a given scale."""
    from shardsched.sim.trace import MIN_REPLAY_LIFETIME_S, replay_compression

    plan = replay_compression(workload, given)
    first = min(c for c, _, _ in workload)
    span_s = max(max(c, d if d is not None else c) for c, d, _ in workload) - first
    span = f"{span_s / 86400:.1f} days" if span_s >= 2 * 86400 else f"{span_s / 3600:.2f} h"
    what = f"replaying {span} of trace ({len(workload)} pods) in about {plan.duration_s:.0f} s"
    if given is None:
        why = (f"time divided by {plan.time_scale:g} and every pause shortened to at most {plan.max_pause_s:g} s, "
               f"so that each pod lives at least {plan.max_pause_s:g} s")
        if plan.shortest_lifetime_s is not None:
            why += f" (the shortest lives {plan.shortest_lifetime_s:g} s of trace)"
        why += (f"; a pod due for deletion before it is bound or found unschedulable holds the replay up to "
                f"{plan.bind_wait_s:g} s")
        click.echo(f"note: {what}: {why}; --time-scale N divides time by N instead", err=True)
    else:
        click.echo(f"note: {what} at time scale {given:g}", err=True)
    if plan.duration_s > timeout_s:
        click.echo(f"warning: the replay takes longer than --timeout {timeout_s:g} s; raise --timeout to at least "
                   f"{plan.duration_s:.0f}" + (" or --time-scale" if given is not None else ""), err=True)
    if given is not None:
        short = sum(1 for c, d, _ in workload if d is not None and (d - c) / given < MIN_REPLAY_LIFETIME_S)
        if short:
            click.echo(f"warning: at this scale {short} of the {len(workload)} pods live under "
                       f"{1000 * MIN_REPLAY_LIFETIME_S:g} ms: they may be deleted before they are scheduled (counted "
                       "as 'deleted before bound'); without --time-scale each pod lives at least that long", err=True)
    return plan


@contextlib.contextmanager
def _stdout_to_stderr(active: bool):
    """While running, send everything written to file descriptor 1 (Ray forwards its workers' and
    raylet's messages there) to stderr, so that ``-o json`` leaves only the JSON on stdout."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


#: ``run --trace``'s profile without ``--config``: kube's defaults and GPUDevice per device
TRACE_PROFILE = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
  plugins:
    multiPoint:
      enabled:
      - name: GPUDevice
        weight: 10
  pluginConfig:
  - name: GPUDevice
    args:
      scoringStrategy: FGDPlus
"""


def _config_source(kw):
    """``--config``, else `TRACE_PROFILE` for a trace replay (unless ``--gpu-aggregate``), else the defaults."""
    if kw["gpu_aggregate"] and (kw["config_path"] or not kw["trace_pods"]):
        raise click.UsageError("--gpu-aggregate goes with --trace and without --config")
    if kw["config_path"]:
        return kw["config_path"]
    return TRACE_PROFILE if kw["trace_pods"] and not kw["gpu_aggregate"] else None


def _workload(kw, scheduler_name: str):
    from shardsched.sim import trace as trace_mod
    from shardsched.sim.workload import uniform_nodes, uniform_pods

    notes: list[str] = []
    if not kw["trace_pods"]:
        for option in ("trace_limit", "time_scale"):
            if kw[option] is not None:
                raise click.UsageError(f"--{option.replace('_', '-')} goes with --trace: give --trace and --trace-nodes, "
                                       "or leave it out")
    if kw["trace_pods"] or kw["trace_nodes"]:
        if not (kw["trace_pods"] and kw["trace_nodes"]):
            raise click.UsageError("--trace and --trace-nodes go together: give both")
        nodes, nrep = trace_mod.load_nodes(kw["trace_nodes"])
        pods, prep = trace_mod.load_pods(kw["trace_pods"], scheduler_name=scheduler_name)
        notes += nrep.skipped + prep.skipped
        if kw["trace_limit"]:
            pods = pods[: kw["trace_limit"]]
        notes += trace_mod.check_pods(pods, nodes)
        if not nodes or not pods:
            raise ValueError("the trace has no usable nodes or pods")
        return nodes, [tuple(p) for p in pods], notes
    nodes = uniform_nodes(kw["nodes"], cpu=kw["node_cpu"], memory=kw["node_memory"], pods=kw["node_pods"])
    pods = uniform_pods(kw["pods"], cpu=kw["pod_cpu"], memory=kw["pod_memory"], scheduler_name=scheduler_name)
    return nodes, [(0.0, None, p) for p in pods], notes


def _reachable(address: str, auth: str) -> None:
    """Say on stderr how ``shardsched scale`` reaches this run: its Ray's address and token."""
    click.echo(f"note: Ray at {address} ({auth}); from another terminal: shardsched scale --ray-address {address} "
               "--shards N", err=True)


def _execute(cls, config, nodes, workload, options, show_progress: bool):
    if not show_progress:
        return cls(config, nodes, workload, options, on_started=_reachable).run()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]scheduling"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), transient=True) as progress:
        task = progress.add_task("run", total=len(workload), info="starting Ray, Redis and the shards")

        def on_progress(bound: int, total: int, status: dict) -> None:
            info = f"pending {status['pending']}  unschedulable {status['unschedulable']}  requeues {status['requeues']}"
            progress.update(task, completed=bound, info=info)

        return cls(config, nodes, workload, options, on_progress=on_progress, on_started=_reachable).run()


def _print_summary(report) -> None:
    """The table of a run: what each figure is, beside it. A burst's table says what its latency
    and throughput measure; a replay's says what became of the trace's pods and how much of the
    cluster they requested. Nothing measured elsewhere is shown as if it were a peer: comparisons
    are ``bench field``'s (the same cluster and pods, one run) and the docs' (the field report)."""
    from rich.table import Table

    data = report.to_json()
    console = output_console()
    lat = data["latency_ms"]
    window = data["schedule_wall_s"]
    kind = "trace replay" if report.replay else "burst"
    table = Table(title=f"shardsched run: {data['nodes']} nodes, {data['pods_total']} pods ({kind}), "
                        f"{report.shards_label} shards")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_column("what it is")
    row = table.add_row
    latency = f"{lat['avg'] / 1000:.3f} / {lat['p50'] / 1000:.3f} / {lat['p99'] / 1000:.3f} s"
    if report.replay:
        deleted_bound = report.samples[-1].deleted_bound if report.samples else 0
        row("bound", f"{data['pods_bound']:,}", f"each pod once; {deleted_bound:,} deleted after binding (their trace end)")
        row("deleted before bound", f"{data['pods_deleted_unbound']:,}", "their trace end came before a bind")
    else:
        row("bound", f"{data['pods_bound']:,} of {data['pods_total']:,}", "each pod once")
    row("unschedulable", f"{data['pods_unschedulable']:,}", "no node fits (reasons below)")
    row("pending", f"{data['pods_pending']:,}", "not created yet, queued, or in a shard")
    if report.replay:
        row("latency avg / P50 / P99", latency, "pod creation to bound")
        row("binds per second", f"{data['throughput_pods_per_s']:,.0f}", f"over the replay's {window:.1f} s [1]")
        for resource, label in _ALLOCATION_ROWS:
            peak = _peak_share(report, resource)
            if peak is not None:
                row(f"{label} requested, peak", f"{100 * peak:.1f}%", f"of allocatable {label}, by running pods")
        notes = ["[1] set by the trace's arrivals, not a capacity: first pod created to last pod bound"]
    else:
        row("latency avg / P50 / P99", latency, "pod creation to bound [1]")
        row("throughput", f"{data['throughput_pods_per_s']:,.0f} pods/s", f"over the scheduling window, {window:.1f} s [2]")
        notes = ["[1] the burst is created at once: a pod also waits for the pods ahead of it, the last ones about "
                 "the whole window",
                 f"[2] first pod created to last pod bound; the whole run took {data['wall_s']:.1f} s with start-up "
                 "and stop"]
    n = len(notes) + 1
    row("CPU", f"{data['cpu_cores_used']:.2f} cores", f"run's processes, average [{n}]")
    notes.append(f"[{n}] driver, coordinator, shards, simulated cluster and Redis, from the workload's start until "
                 f"the run settled ({report.metered_s:.1f} s); Ray's own daemons used {data['ray_system_cpu_cores']:.2f} "
                 "cores more")
    row("memory", f"{data['peak_rss_bytes'] / 2**30:.2f} GB", "peak RSS of those processes together")
    row("requeues", f"{data['requeues']:,}", "pods handed back to the rebalancer")
    row("bind conflicts", f"{data['conflicts']:,}", "binds answered 409 Conflict")
    row("replaced shards", f"{data['replaced_shards']}", "failed health checks, started again")
    row("coordinator restarts", f"{data['coordinator_restarts']}", "a new one adopted the shards")
    row("ledger rebuilds", f"{data['ledger_rebuilds']}", "Redis ledger rebuilt from the cluster")
    console.print(table)
    for note in notes:
        console.print(f"[dim]{note}[/]", highlight=False)
    console.print("[dim]This run only. `shardsched bench field` compares kube-scheduler's one-pod loop, batching "
                  "and shards on the same cluster and pods in one run; the field report's figures (another "
                  "cluster and hardware) are in docs/benchmarks.md.[/]")
    ok = lambda v: "[green]0[/]" if v == 0 else f"[red]{v}[/]"  # noqa: E731
    if report.interrupted:
        console.print(f"[yellow]interrupted ({report.interrupted}) {window:.1f} s into the run: "
                      "the counts are those at the stop[/]", highlight=False)
    console.print(f"invariants: overcommitted nodes {ok(data['overcommitted_nodes'])}   double binds "
                  f"{ok(data['double_binds'])}   lost pods {ok(data['lost_pods'])}   admission rejections "
                  f"{ok(data['admission_rejections'])}")
    if data["scaling"]:
        from shardsched.cli.scale import describe

        def rate(x):
            return "-" if x is None else f"{x:.0f}"

        for step in data["scaling"]:
            console.print(f"at {step['at_s']:.1f} s: {describe(step)}; pods/s before {rate(step['throughput_before_pods_per_s'])}, "
                          f"during {rate(step['throughput_during_pods_per_s'])}, after {rate(step['throughput_after_pods_per_s'])}",
                          highlight=False)
    for reason, n in sorted(data["unschedulable_reasons"].items(), key=lambda kv: -kv[1])[:5]:
        console.print(f"  {n} unschedulable: {reason}")
    for r in data["redis_restarts"]:
        console.print(f"[yellow]the embedded redis-server (pid {r['pid']}) exited ({r['exit']}) at {r['at_s']:.1f} s and "
                      "was started again[/]", highlight=False)
    for err in data["errors"]:
        console.print(f"[yellow]note: {err}[/]")


#: (resource, name in the table) of the allocation rows of a replay, when the cluster has them
_ALLOCATION_ROWS = (("cpu", "CPU"), ("memory", "memory"), ("alibabacloud.com/gpu-milli", "GPU"))


def _peak_share(report, resource: str) -> float | None:
    """The highest share of the cluster's allocatable ``resource`` requested over the run's samples
    (None when the cluster has none of it)."""
    alloc = report.allocatable.get(resource, 0)
    if not alloc or not report.samples:
        return None
    return max(x.requested.get(resource, 0) for x in report.samples) / alloc


def _plot(report, path: str) -> None:
    """Write the run's plot (`plots.run_timeline`) and say where; a run of fewer than 2 samples
    gets a warning instead. Raises OSError when the file cannot be written."""
    from shardsched.bench.plots import run_timeline
    from shardsched.sharding.embedded import SAMPLE_PERIOD_S

    if len(report.samples) < 2:
        click.echo(f"warning: --plot {path}: not written: the run took {len(report.samples)} sample(s) of the "
                   "cluster, a curve needs 2", err=True)
        return
    run_timeline(path, report, SAMPLE_PERIOD_S)
    click.echo(f"plot: {os.path.abspath(path)} ({len(report.samples)} samples over "
               f"{report.samples[-1].t_s:.1f} s)", err=True)
