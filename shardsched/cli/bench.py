"""``shardsched bench``: benchmarks, each measured in the run that prints it."""

from __future__ import annotations

import fnmatch
import json
import os
import sys

import click

from shardsched.cli import MAX_BATCH_SIZE_HELP, SEED_HELP, FiniteFloat, Quantity, output_console


@click.group()
def bench() -> None:
    """Benchmarks on this machine (figures are measured in the run that prints them).

    \b
    decision   the decision path alone (Filter/Score/select/assume), one process
    preemption DefaultPreemption's PostFilter alone, vectorized and per node, one process
    field      the field report's table: kube-like baseline, single, batch-10, batch-auto, shards-N
    perf       kube-scheduler's scheduler_perf workloads, with their throughput thresholds
    gpu-frag   GPU fragmentation on the Alibaba openb trace (FGD's experiment), per policy
    scaling    throughput and P99 vs nodes and shards, pods/s vs batch size
    gangs      the coordinator deciding and holding gangs (PodGroups), one process

    \b
    field, perf and scaling run the embedded main job (local Ray, private Redis, simulated
    cluster, coordinator, shards) once per row, print a Markdown table on stdout (or JSON with
    -o json), write PNG plots with --plot-dir, and show progress on stderr.
    """


@bench.command()
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True,
              help="Nodes (8 CPU / 16Gi, a third of them tainted) the pods are decided against.")
@click.option("--pods", type=click.IntRange(1), default=20000, show_default=True, help="Pods of the one-signature workload.")
@click.option("--distinct", type=click.IntRange(1), default=5000, show_default=True, help="Pods of the all-distinct workload.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True, help="Runs per workload; the best is reported.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the distinct workload and the tie-breaks.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Profile file (default: kube's default profile).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def decision(nodes: int, pods: int, distinct: int, repeat: int, seed: int, config_path: str | None, output: str) -> None:
    """Pod decisions per second of the scheduling core alone (no Redis, no binding).

    \b
    one-signature: identical 1 CPU / 1Gi pods (the field report's burst);
    distinct:      every pod different (random requests, zone selectors, tolerations).
    """
    from shardsched.bench import decision as mod

    results, peak = mod.run(nodes, pods, distinct, repeat, seed, config_path)
    if output == "json":
        click.echo(json.dumps({"results": [r.to_json() for r in results], "peak_rss_bytes": peak}, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"decision path, {nodes} nodes, one process (best of {repeat})")
    for col in ("workload", "pods", "scheduled", "decisions/s", "time"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.workload, str(r.pods), str(r.scheduled), f"{r.decisions_per_s:,.0f}", f"{r.best_s:.3f} s")
    console = output_console()
    console.print(table)
    for r in results:
        if r.unscheduled_by:
            console.print(f"{r.workload}: {r.pods - r.scheduled:,} of {r.pods:,} pods not scheduled; every node was "
                          "rejected for them", highlight=False)
            for plugins, n in r.unscheduled_by.items():
                why = f" ({mod.BY_CONSTRUCTION[plugins]})" if plugins in mod.BY_CONSTRUCTION else ""
                console.print(f"  {n:,} by {plugins}{why}", highlight=False)
    console.print(f"peak RSS of this process: {peak / 2**20:.0f} MiB")


@bench.command()
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True,
              help="Nodes (4 CPU / 32Gi, 4 pods of priority 0 on each, as scheduler_perf's PreemptionBasic).")
@click.option("--repeat", type=click.IntRange(1), default=200, show_default=True,
              help="Decisions per pod on the vectorized path; the mean is reported.")
@click.option("--per-node-repeat", type=click.IntRange(1), default=3, show_default=True,
              help="Decisions per pod on the per-node path (slow).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds the search's random offset.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Profile file (default: kube's default profile).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def preemption(nodes: int, repeat: int, per_node_repeat: int, seed: int, config_path: str | None, output: str) -> None:
    """CPU time of one DefaultPreemption PostFilter, vectorized and per node.

    \b
    no-fit:     priority 10, 9 CPU: lower-priority pods everywhere, no node big enough;
    no-victims: priority 0, 3 CPU: nothing of lower priority anywhere;
    preempts:   priority 10, 3 CPU: every node a candidate (PreemptionBasic's preemptor).
    """
    from shardsched.bench import preemption as mod
    from shardsched.bench.harness import machine

    started = machine()
    results = mod.run(nodes, repeat, per_node_repeat, seed, config_path)
    if output == "json":
        click.echo(json.dumps({"machine": started, "results": [r.to_json() for r in results]}, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"DefaultPreemption PostFilter, {nodes} nodes, {nodes * mod.PODS_PER_NODE} pods, one process")
    for col in ("pod", "path", "decisions", "PostFilter CPU", "attempt CPU", "outcome"):
        table.add_column(col, justify="left" if col in ("pod", "path", "outcome") else "right")
    for r in results:
        table.add_row(r.pod, r.path, str(r.decisions), f"{r.cpu_ms:.3f} ms", f"{r.attempt_cpu_ms:.3f} ms", r.outcome)
    output_console().print(table)


def _output_options(f):
    f = click.option("--plot-dir", type=click.Path(file_okay=False), help="Write PNG plots into this folder.")(f)
    f = click.option("--save-json", type=click.Path(dir_okay=False),
                     help="Also write the JSON result to this file (whatever -o is).")(f)
    f = click.option("-o", "--output", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)(f)
    f = click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")(f)
    return f


def _int_list(ctx, param, value):
    from shardsched.bench.harness import parse_int_list

    if value is None:
        return None
    try:
        return parse_int_list(value)
    except ValueError:
        raise click.BadParameter(f"expected a comma-separated list of integers (1k = 1000), got {value!r}") from None


def _row_pods(ctx, param, value) -> dict[str, int]:
    out = {}
    for item in value:
        row, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit() or int(n) < 1:
            raise click.BadParameter(f"expected ROW=PODS (e.g. single=5000), got {item!r}")
        out[row.strip()] = int(n)
    return out


def _relative(path) -> str:
    """A plot's path relative to the working directory where it lies under it, else as given (a
    saved result names no machine's absolute paths)."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


def _emit(kw: dict, data: dict, markdown: str, plot) -> None:
    paths = plot() if kw["plot_dir"] else []
    if paths:
        data["plots"] = [_relative(p) for p in paths]
    if kw["save_json"]:
        with open(kw["save_json"], "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
    if kw["output"] == "json":
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(markdown)
    for p in paths:
        click.echo(f"plot: {p}")


def _fail(e: Exception) -> None:
    click.echo(f"error: {e}", err=True)
    sys.exit(1)


@bench.command()
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True, help="Nodes of the simulated cluster.")
@click.option("--node-cpu", type=Quantity("cpu"), default="8", show_default=True, help="Allocatable CPU per node.")
@click.option("--node-memory", type=Quantity("memory"), default="16Gi", show_default=True,
              help="Allocatable memory per node.")
@click.option("--pods", type=click.IntRange(1), default=20000, show_default=True, help="Pods in each row's burst.")
@click.option("--pod-cpu", type=Quantity("cpu"), default="1", show_default=True, help="CPU request per pod.")
@click.option("--pod-memory", type=Quantity("memory"), default="1Gi", show_default=True, help="Memory request per pod.")
@click.option("--row-pods", multiple=True, callback=_row_pods, metavar="ROW=PODS",
              help="Burst size for one row instead of --pods (repeatable), e.g. --row-pods single=5000.")
@click.option("--rows", help="Comma-separated rows to run (default: all): kube-like, single, batch-10, batch-auto, shards-N.")
@click.option("--shards", "shard_counts", default="1,2,4", show_default=True, callback=_int_list,
              help="N of the shards-N rows.")
@click.option("--max-batch-size", type=click.IntRange(1), default=1000, show_default=True, help=MAX_BATCH_SIZE_HELP)
@click.option("--bind-latency-ms", type=FiniteFloat(0), default=0.0, show_default=True,
              help="Simulated API answer time per bind call, for every row (kube-like pays it per pod).")
@click.option("--rate", "rate_pods_per_s", type=FiniteFloat(0, min_open=True),
              help="Paced load instead of a burst: each row's pods are created at this steady rate (pods/s; "
                   "the pods of each 5 ms created together), so the latency columns are those of a pod arriving "
                   "at that load rather than waiting behind a burst (e.g. --rate 2000 --pods 120000 --pod-cpu 100m "
                   "--pod-memory 128Mi: 60 s, and every pod fits 5,000 nodes).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Profile file (default: kube's default profile).")
@click.option("--seed", type=int, default=0, show_default=True, help=SEED_HELP)
@click.option("--timeout", "timeout_s", type=FiniteFloat(0, min_open=True), default=600.0, show_default=True,
              help="Give up on a row after this many seconds.")
@click.option("--profile-dir", type=click.Path(file_okay=False),
              help="Run py-spy (-f raw) on every process of each row, write the files here and add a "
                   "'where the time goes' section (profiled figures are slower: quote the shares, not the rates).")
@_output_options
def field(**kw) -> None:
    """The field report's table on the embedded simulated cluster, every row in this run.

    \b
    Rows: kube-like (kube-scheduler's loop emulated in one process: one pod per cycle from a
    SchedulingQueue, full default plugins, adaptive percentageOfNodesToScore, one bind at a time,
    no signature cache), single (1 shard, batch 1), batch-10, batch-auto (adaptive batch), and
    shards-1/2/4 (adaptive batch). Columns: avg, P50 and P99 latency (creation to bound), pods/s,
    CPU cores, peak memory; the report's figures beside, ratios to kube-like of this run. With
    --rate the pods arrive at that steady rate instead of in one burst.
    """
    from shardsched.bench import field as mod
    from shardsched.bench.harness import Progress, machine
    from shardsched.errors import ConfigError

    params = mod.FieldParams(
        nodes=kw["nodes"], node_cpu=kw["node_cpu"], node_memory=kw["node_memory"], pods=kw["pods"],
        pod_cpu=kw["pod_cpu"], pod_memory=kw["pod_memory"], row_pods=kw["row_pods"],
        rows=[r.strip() for r in kw["rows"].split(",")] if kw["rows"] else None,
        shard_counts=tuple(kw["shard_counts"]), max_batch_size=kw["max_batch_size"],
        bind_latency_ms=kw["bind_latency_ms"], rate_pods_per_s=kw["rate_pods_per_s"], seed=kw["seed"],
        timeout_s=kw["timeout_s"],
        config_path=kw["config_path"], profile_dir=kw["profile_dir"])
    host = machine()
    try:
        with Progress("field", quiet=kw["quiet"]) as progress:
            rows = mod.run(params, progress)
    except (ConfigError, ValueError) as e:
        _fail(e)
    _emit(kw, mod.to_json(rows, params, host), mod.markdown(rows, params), lambda: mod.plot(rows, params, kw["plot_dir"]))


@bench.command()
@click.option("--workload", "workloads", multiple=True, metavar="PATTERN",
              help="Workload to run, TestCase/workload, glob allowed (repeatable); default: the performance-size "
                   "workloads of SchedulingBasic, SchedulingNodeAffinity, SchedulingWithNodeInclusionPolicy, "
                   "Unschedulable, SchedulingWithMixedChurn, SchedulingWithExtendedResource, HostPortConflict, "
                   "PreemptionBasic (5000Nodes, commented out upstream), PreemptionAsync, GangScheduling, "
                   "SchedulingSecrets, SchedulingInTreePVs, SchedulingMigratedInTreePVs, SchedulingCSIPVs and "
                   "PreemptionPVs (--list marks them).")
@click.option("--list", "list_only", is_flag=True, help="List every workload of the configs with its status and exit.")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Folder of kube-scheduler's scheduler_perf workloads, copied from the kubernetes repository's "
                   "test/integration/scheduler_perf: one subfolder per test with its performance-config.yaml and "
                   "the templates it names. Default: $SHARDSCHED_SCHEDULER_PERF_DIR, else the copy shipped with "
                   "shardsched (shardsched/bench/workloads/scheduler_perf; not the working directory).")
@click.option("--shards", type=click.IntRange(1, 64), default=2, show_default=True, help="Shard actors of each workload's run.")
@click.option("--batch-size", type=click.IntRange(0), default=0, show_default=True, help="0 = adaptive.")
@click.option("--max-batch-size", type=click.IntRange(1), default=1000, show_default=True, help=MAX_BATCH_SIZE_HELP)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Profile file (default: kube's default profile).")
@click.option("--seed", type=int, default=0, show_default=True, help=SEED_HELP)
@click.option("--timeout", "timeout_s", type=FiniteFloat(0, min_open=True), default=900.0, show_default=True,
              help="Give up on a workload after this many seconds.")
@_output_options
def perf(**kw) -> None:
    """kube-scheduler's scheduler_perf workloads that shardsched's plugins can express.

    \b
    Read from upstream's performance-config.yaml files and templates: nodes from the node
    templates, init pods created already bound, the measured pods in one burst, churn ops while
    they are scheduled. Each workload's throughput threshold (upstream's floor for kube-scheduler)
    is shown beside our pods/s; workloads that preempt also report their preemptions (per second
    and victims per preemptor). Workloads that need plugins shardsched lacks are listed as skipped
    with the reason; ones with an ignored part are marked partial.
    """
    from shardsched.bench import perf as mod
    from shardsched.bench.harness import Progress, machine, markdown_table
    from shardsched.errors import ConfigError

    if kw["list_only"]:
        try:
            cat = mod.catalog(mod.load_workloads(kw["data_dir"]))
        except FileNotFoundError as e:
            _fail(e)
        if kw["output"] == "json":
            click.echo(json.dumps(cat, indent=2))
        else:
            default = {c["workload"] for c in cat
                       if any(fnmatch.fnmatchcase(c["workload"], pat) for pat in mod.DEFAULT_WORKLOADS)}
            click.echo(markdown_table(["workload", "threshold", "status", "default", "reasons"],
                                      [[c["workload"], c["threshold"] or "—", c["status"],
                                        "yes" if c["workload"] in default else "", "; ".join(c["reasons"])] for c in cat]))
        return
    params = mod.PerfParams(workloads=list(kw["workloads"]) or None, data_dir=kw["data_dir"], shards=kw["shards"],
                            batch_size=kw["batch_size"], max_batch_size=kw["max_batch_size"], seed=kw["seed"],
                            timeout_s=kw["timeout_s"], config_path=kw["config_path"])
    host = machine()
    try:
        with Progress("perf", quiet=kw["quiet"]) as progress:
            results, cat = mod.run(params, progress)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        _fail(e)
    _emit(kw, mod.to_json(results, cat, params, host), mod.markdown(results, cat, params),
          lambda: mod.plot(results, kw["plot_dir"]))


@bench.command()
@click.option("--nodes", "node_counts", default="1k,5k,20k,50k", show_default=True, callback=_int_list,
              help="Cluster sizes of the nodes sweep.")
@click.option("--shards", "shard_counts", default="1,2,4", show_default=True, callback=_int_list,
              help="Shard counts of the shards sweep.")
@click.option("--batch-sizes", default="1,10,100,1000,0", show_default=True, callback=_int_list,
              help="Batch sizes of the batch sweep (0 = adaptive).")
@click.option("--sweeps", default="nodes,shards,batch", show_default=True, help="Which sweeps to run.")
@click.option("--pods", type=click.IntRange(1), default=20000, show_default=True,
              help="Burst per point (at most 4 per node, i.e. 50% of the CPU).")
@click.option("--batch-pods", type=click.IntRange(1), default=5000, show_default=True, help="Burst of the batch sweep.")
@click.option("--base-nodes", type=click.IntRange(1), default=5000, show_default=True,
              help="Nodes of the shards and batch sweeps.")
@click.option("--base-shards", type=click.IntRange(1, 64), default=2, show_default=True, help="Shards of the nodes sweep.")
@click.option("--max-batch-size", type=click.IntRange(1), default=1000, show_default=True, help=MAX_BATCH_SIZE_HELP)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Profile file (default: kube's default profile).")
@click.option("--seed", type=int, default=0, show_default=True, help=SEED_HELP)
@click.option("--timeout", "timeout_s", type=FiniteFloat(0, min_open=True), default=900.0, show_default=True,
              help="Give up on a point after this many seconds.")
@_output_options
def scaling(**kw) -> None:
    """Throughput and P99 latency vs nodes and vs shards; pods/s vs batch size.

    \b
    Field-report nodes (8 CPU / 16Gi) and pods (1 CPU / 1Gi), one embedded run per point.
    """
    from shardsched.bench import scaling as mod
    from shardsched.bench.harness import Progress, machine
    from shardsched.errors import ConfigError

    if any(n < 1 for n in kw["node_counts"] + kw["shard_counts"]) or any(b < 0 for b in kw["batch_sizes"]):
        _fail(ValueError("--nodes and --shards take positive integers, --batch-sizes non-negative ones"))
    params = mod.ScalingParams(
        nodes=kw["node_counts"], shards=kw["shard_counts"], batch_sizes=kw["batch_sizes"],
        sweeps=tuple(s.strip() for s in kw["sweeps"].split(",") if s.strip()), pods=kw["pods"],
        batch_pods=kw["batch_pods"], base_nodes=kw["base_nodes"], base_shards=kw["base_shards"],
        max_batch_size=kw["max_batch_size"], seed=kw["seed"], timeout_s=kw["timeout_s"], config_path=kw["config_path"])
    host = machine()
    try:
        with Progress("scaling", quiet=kw["quiet"]) as progress:
            points = mod.run(params, progress)
    except (ConfigError, ValueError) as e:
        _fail(e)
    _emit(kw, mod.to_json(points, params, host), mod.markdown(points), lambda: mod.plot(points, kw["plot_dir"]))


@bench.command()
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True, help="Nodes (8 CPU / 16Gi).")
@click.option("--shards", type=click.IntRange(1, 64), default=2, show_default=True, help="Shards (plain objects).")
@click.option("--workloads", default="1x5000,1000x3", show_default=True,
              help="Comma-separated GANGSxPODS: that many gangs of that many 100m pods each, minMember = PODS.")
@click.option("-o", "--output", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
def gangs(nodes: int, shards: int, workloads: str, output: str) -> None:
    """Gangs: the coordinator's decision of whole gangs and their one ledger call each, then their
    members bound by the shards; coordinator and shards in this process, stepped in turn."""
    from shardsched.bench import gangs as mod

    try:
        shapes = [tuple(int(x) for x in w.strip().split("x")) for w in workloads.split(",") if w.strip()]
        if any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
    except ValueError:
        _fail(ValueError(f"--workloads: expected GANGSxPODS[,GANGSxPODS...] of positive integers, got {workloads!r}"))
    results = [mod.run_one(g, s, nodes, shards) for g, s in shapes]
    if output == "json":
        click.echo(json.dumps({"results": [r.to_json() for r in results]}, indent=2))
        return
    click.echo(mod.markdown(results))


def _seed_range(ctx, param, value):
    if value is None:
        return None
    out: list[int] = []
    try:
        for part in value.split(","):
            lo, sep, hi = part.strip().partition("-")
            out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise click.BadParameter(f"expected seeds as 42-51 or 1,2,5, got {value!r}") from None
    if not out:
        raise click.BadParameter("no seed given")
    return out


@bench.command("gpu-frag")
@click.option("--pod-list", default="default", show_default=True, metavar="NAME",
              help="Pod list of the openb trace: default, gpushare40, gpuspec33, multigpu50, cpu050, or a CSV file.")
@click.option("--policy", type=click.Choice(["random", "bestfit", "packing", "dotprod", "fgd", "fgd-bestfit", "fgd-plus"]),
              default="fgd-plus", show_default=True,
              help="Placement policy (GPUDevice's scoring strategies); fgd-plus is the one recommended.")
@click.option("--seeds", default="42-51", show_default=True, callback=_seed_range,
              help="Seeds of the runs (shuffle, inflation, tie-breaks): a range 42-51 or a list.")
@click.option("--seed", type=int, help="One run with this seed (instead of --seeds).")
@click.option("--placements-out", type=click.Path(dir_okay=False),
              help="With --seed: write one JSON line per pod in submission order (name, requests, node, devices).")
@click.option("--nodes-file", type=click.Path(dir_okay=False, exists=True),
              help="Node list CSV (default: the 1,213 GPU nodes of openb_node_list_gpu_node.csv).")
@click.option("--shards", type=click.IntRange(1), default=None,
              help="Run through the sharded runtime with this many shards (simulated cluster, Redis ledger, "
                   "coordinator), pods created in waves in submission order; without it the decisions are made "
                   "in this process.")
@click.option("--wave", type=click.IntRange(1), default=16, show_default=True,
              help="With --shards: pods per wave; the next wave starts once each pod of this one is bound or "
                   "unschedulable (then deleted, never retried).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write the allocation curves as a PNG.")
@click.option("--save-json", type=click.Path(dir_okay=False), help="Also write the JSON result to this file.")
@click.option("-o", "--output", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
def gpu_frag(pod_list: str, policy: str, seeds: list[int], seed: int | None, placements_out: str | None,
             nodes_file: str | None, shards: int | None, wave: int, plot_path: str | None, save_json: str | None,
             output: str) -> None:
    """Unallocated GPU at 100% and 130% of arrival, after Weng et al. (USENIX ATC '23).

    \b
    The 1,213 GPU nodes of the openb trace (pods capacity 1001); the pod list sorted by name,
    shuffled with the seed, inflated to 130% of the cluster's GPU capacity with clones named
    <name>-tuned-<i>; one attempt per pod, nothing deleted. Reports the unallocated share of the
    GPU capacity when the arrived demand reaches 100% and 130% (mean and sd over the seeds) beside
    the paper's published value.
    """
    from shardsched.bench import gpufrag
    from shardsched.sim.trace import TraceError

    if placements_out and seed is None:
        raise click.UsageError("--placements-out needs --seed (one run)")
    try:
        nodes, pods, skipped = gpufrag.load(pod_list, nodes_file)
    except TraceError as e:
        _fail(e)
    for line in skipped:
        click.echo(f"skipped {line}", err=True)
    problems: list[str] = []
    runs = [seed] if seed is not None else seeds
    out = placements_out if seed is not None else None
    if shards is None:
        results = [gpufrag.run_one(nodes, pods, pod_list, policy, s, out, problems if i == 0 else None)
                   for i, s in enumerate(runs)]
    else:
        from shardsched.bench import gpufrag_shards
        from shardsched.bench.harness import RaySession

        try:
            with RaySession() as session:
                results = [gpufrag_shards.run_one(nodes, pods, pod_list, policy, s, shards, session.address, wave, out,
                                                  problems if i == 0 else None)
                           for i, s in enumerate(runs)]
        except RuntimeError as e:
            _fail(e)
    for line in problems:
        click.echo(f"never placeable: {line}", err=True)
    summary = gpufrag.summarize(results)
    data = {"summary": summary, "runs": [r.to_json() for r in results], "skipped_rows": skipped,
            "never_placeable": problems}
    if plot_path:
        data["plot"] = gpufrag.plot(plot_path, results)
    if save_json:
        with open(save_json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
    if output == "json":
        click.echo(json.dumps(data, indent=2))
        return
    def cell(v):
        return "" if v is None else f"{v:.2f}"

    click.echo("| pod list | policy | seeds | unallocated GPU % at 100% | at 130% | paper, this policy | "
               "paper, FGD | ms per decision |")
    click.echo("|---|---|---|---:|---:|---:|---:|---:|")
    click.echo(f"| {pod_list} | {policy} | {len(results)} | {summary['unallocated_100%_mean']:.2f} ± "
               f"{summary['unallocated_100%_sd']:.2f} | {summary['unallocated_130%_mean']:.2f} ± "
               f"{summary['unallocated_130%_sd']:.2f} | {cell(summary['paper_100%'])} | "
               f"{cell(summary['paper_fgd_100%'])} | {summary['decision_ms_mean']:.3f} |")
    if plot_path:
        click.echo(f"plot: {plot_path}")


from shardsched.cli.bench_kube import kube_vs_shardsched  # noqa: E402 - a sub-command of its own module

bench.add_command(kube_vs_shardsched)
