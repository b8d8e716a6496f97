"""``shardsched bench kube-vs-shardsched``: kube-scheduler and ``serve`` on one real API server."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from shardsched.cli import output_console

VARIANT_CHOICES = {"kube": "kube-scheduler", "threads": "shardsched-threads", "ray": "shardsched-ray"}


def _rates(ctx, param, value):
    try:
        rates = tuple(float(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: a comma-separated list of pods/s, e.g. 50,100,200") from None
    if not rates or any(r <= 0 for r in rates):
        raise click.BadParameter(f"{value!r}: every rate must be > 0 pods/s")
    return rates


def _variants(ctx, param, value):
    names = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in names if x not in VARIANT_CHOICES]
    if bad or not names:
        raise click.BadParameter(f"{value!r}: a comma-separated list of {', '.join(VARIANT_CHOICES)}")
    return tuple(dict.fromkeys(VARIANT_CHOICES[x] for x in names))


@click.command("kube-vs-shardsched")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An existing cluster's admin kubeconfig (the bench creates nodes and pods, reads and deletes "
                   "Events). Default: start etcd and kube-apiserver from $KUBEBUILDER_ASSETS, as the envtest tests do.")
@click.option("--kube-scheduler", "kube_scheduler", type=click.Path(dir_okay=False), default=None,
              help="The kube-scheduler binary (default: $KUBEBUILDER_ASSETS/kube-scheduler). Its "
                   "configuration is written as kubescheduler.config.k8s.io/v1beta3 (kube-scheduler 1.23-1.25).")
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True,
              help="Nodes created and reported Ready (no kubelet; tainted and labelled for the bench, deleted at the end).")
@click.option("--pods", type=click.IntRange(1), default=3000, show_default=True,
              help="Pods of the backlog, created before each scheduler is launched.")
@click.option("--rates", callback=_rates, default="50,100,200", show_default=True,
              help="Paced phases: pods created per second, one phase per rate, once the backlog is bound.")
@click.option("--paced-seconds", "paced_s", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds each paced phase creates pods for.")
@click.option("--repeats", type=click.IntRange(1), default=2, show_default=True,
              help="Runs of every scheduler; they alternate (the order rotates each repeat).")
@click.option("--schedulers", "variants", callback=_variants, default="kube,threads,ray", show_default=True,
              help="Which to run: kube (kube-scheduler), threads (serve --mode threads), ray (serve --mode ray).")
@click.option("--qps", type=click.FloatRange(min=0), default=5000.0, show_default=True,
              help="kube-scheduler's clientConnection.qps, and serve's --kube-api-qps.")
@click.option("--burst", type=click.IntRange(1), default=5000, show_default=True,
              help="kube-scheduler's clientConnection.burst, and serve's --kube-api-burst.")
@click.option("--namespace", default="default", show_default=True, help="Namespace (existing) of the bench's pods.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1), default=300.0, show_default=True,
              help="Seconds to wait for a phase's pods to be bound (after a paced phase's creations).")
@click.option("--sigterm-after", "sigterm_after_s", type=click.FloatRange(min=0), default=0.5, show_default=True,
              help="Seconds after the last paced bind at which the scheduler gets SIGTERM.")
@click.option("--sigterm-wait", "sigterm_wait_s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds a scheduler may take to exit after SIGTERM before it is killed (SIGKILL).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: medians side by side with the ratio; json: every run's raw figures, the options and the "
                   "API server's version.")
def kube_vs_shardsched(**kw) -> None:
    """kube-scheduler against shardsched serve on the same real kube-apiserver, alternating.

    \b
    Each scheduler, in turn, --repeats times, with a schedulerName of its own:
      backlog   --pods pods created before it is launched: launch -> first bind, launch -> last
                bind, pods/s from the first bind to the last, cores busy
      paced     once warm, pods created at each of --rates for --paced-seconds: creation (the
                create call returned) -> bound (the watch event showing spec.nodeName), P50/P99
      Events    each pod's Scheduled Event on the watch - its bind (P50/P99); SIGTERM goes out
                --sigterm-after s after the last bind: Events missing once it has exited
      memory    peak resident memory summed over its process tree (serve, its Redis, Ray's
                processes), and the processes counted
    Between runs the pods and the Scheduled Events are deleted and the bench waits until the
    server lists no pod of it. Ratio columns = shardsched / kube-scheduler (each row says whether
    lower or higher is better). See docs/benchmarks.md, "kube-scheduler side by side".
    """
    from shardsched.bench import kube_side
    from shardsched.bench import kube_side_report as rep

    assets = os.environ.get("KUBEBUILDER_ASSETS")
    binary = kw.pop("kube_scheduler") or (str(Path(assets) / "kube-scheduler") if assets else None)
    if "kube-scheduler" in kw["variants"] and (not binary or not os.access(binary, os.X_OK)):
        raise click.UsageError(f"no kube-scheduler binary: {binary or 'KUBEBUILDER_ASSETS is not set'} (give "
                               "--kube-scheduler PATH, or --schedulers threads,ray)")
    kubeconfig = kw.pop("kubeconfig")
    folder = None
    if kubeconfig is None:
        folder, why = kube_side.control_plane_assets()
        if folder is None:
            raise click.UsageError(f"no API server to run against: {why}; or give --kubeconfig")
    output = kw.pop("output")
    opts = kube_side.SideOptions(kube_scheduler=binary or "", **kw)

    def progress(line: str) -> None:
        click.echo(line, err=True)
    try:
        result = kube_side.run_side_by_side(opts, kubeconfig, folder, progress)
    except KeyboardInterrupt:
        click.echo("interrupted: every process started was stopped", err=True)
        sys.exit(130)
    data = result.to_json()
    if output == "json":
        click.echo(json.dumps(data, indent=2))
    else:
        console = output_console()
        console.print(f"API server {result.server_version}, {opts.nodes:,} nodes, {opts.pods:,}-pod backlog, "
                      f"{opts.repeats} repeat(s); medians", highlight=False)
        click.echo(rep.markdown(data["summary"], opts.variants))
        for e in result.errors:
            console.print(f"[red]error[/red]: {e}", highlight=False)
    if result.errors:
        sys.exit(1)
