"""``shardsched simulate``: where would these pods go? (see shardsched.scheduler.simulate)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Callable, Iterator

import click

from shardsched.errors import ConfigError

#: exit code for input that stops the simulation: a bad --config, a -f file that does not exist
EXIT_FATAL = 1
#: exit code for invalid input (some objects were left out; the rest was simulated)
EXIT_INVALID_INPUT = 2


@click.command()
@click.option("-f", "--filename", "files", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="YAML or JSON manifest (multi-document, kind: List allowed). Repeatable.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="KubeSchedulerConfiguration file (profiles, plugins, args); an empty file is an error. "
                   "Default: kube's default profile.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for breaking score ties and for the names generated from metadata.generateName.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: the pods and nodes as tables (160 columns wide off a terminal); json: one object with "
                   "pods (status, node, GPU devices, reason, requests) and nodes (allocatable, requested), for scripts.")
def simulate(files: tuple[str, ...], config_path: str | None, seed: int, output: str) -> None:
    """Place the unbound pods of Kubernetes manifests on their nodes, as kube-scheduler would.

    \b
    Nodes and pods come from the files; pods with spec.nodeName are existing pods and use their
    node's resources. Unbound pods are placed one at a time in queue order (higher priority first,
    then input order), each seeing the placements before it. PriorityClass objects resolve
    priorityClassName, Namespace objects give their labels to pod affinity's namespaceSelector;
    other kinds are ignored with a warning. Every plugin of the profile runs over the whole
    cluster, pod affinity, anti-affinity and topology spread included. Each pod gets one attempt
    (kube-scheduler would retry an unschedulable pod when the cluster changes, e.g. once a pod it
    is affine to binds) and is Scheduled, Unschedulable (with kube's "0/N nodes are available"
    message; this includes pods refused because they need a plugin shardsched does not
    implement: volumes to bind or to check, resource claims), Gated (spec.schedulingGates set: not placed) or Skipped (being
    deleted, or terminal).

    \b
    Objects are taken as the API server would take them: an object with generateName and no
    name gets generateName + 5 random characters (the same for the same input and --seed); a
    Node without status.allocatable gets its status.capacity; names, resource names and
    requests against limits are checked with the API server's rules.

    \b
    Warnings on stderr (the simulation still runs): a file without objects; a pod bound to a
    node that is not in the input (it counts on no node); a bound pod that does not fit its
    node (the kubelet would reject it; it is kept on the node); pods whose schedulerName no
    profile has (kube-scheduler would leave them Pending; they are placed with the first
    profile, and the warning says how many and which schedulerName); a null quantity (read as
    0, as the API server reads it).

    \b
    Files are read as kubectl reads them: UTF-8, or UTF-16/UTF-32 with a byte order mark.
    On a terminal a progress bar shows on stderr while the input is read and pods are placed.

    \b
    Exit status: 0 when the simulation ran (unschedulable pods are a result);
    2 when some input was invalid: each bad object (or unreadable file) is named on stderr, in
    input order, as file#N: field: problem (N counts documents from 1), left out, and the rest
    is still simulated and printed; 1 for a bad --config or a -f file that does not exist
    (kubectl's "error: the path ... does not exist"), and nothing is simulated.
    """
    from shardsched.scheduler.simulate import simulate as run_simulation

    for f in files:
        if not os.path.lexists(f):  # kubectl's words and status for a missing -f
            click.echo(f'error: the path "{f}" does not exist', err=True)
            sys.exit(EXIT_FATAL)
    try:
        with _progress(output) as progress:
            report = run_simulation(list(files), config_path, seed, progress)
    except ConfigError as e:
        for line in str(e).splitlines():  # one problem a line
            click.echo(f"error: {line}", err=True)
        sys.exit(EXIT_FATAL)
    for w in report.warnings:
        click.echo(f"warning: {w}", err=True)
    for e in report.errors:
        click.echo(f"error: {e}", err=True)
    if output == "json":
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_table(report)
    if report.errors:
        sys.exit(EXIT_INVALID_INPUT)


@contextlib.contextmanager
def _progress(output: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while the input is read and the pods are placed, when stderr is a
    terminal and the output a table (nothing on a pipe or with ``-o json``); yields the
    ``progress(done, total)`` callback of `shardsched.scheduler.simulate.simulate`, or None."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if output != "table" or not console.is_terminal:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("reading manifests", total=None)

        def progress(done: int, total: int) -> None:
            if done == 0:
                bar.update(task, description="placing pods", total=total)
            if done % 100 == 0:
                bar.update(task, completed=done)

        yield progress


def _print_table(report) -> None:
    from rich.markup import escape
    from rich.table import Table

    from shardsched.api.quantity import format_quantity
    from shardsched.cli import output_console

    def fmt(res: dict) -> str:
        return ", ".join(f"{k}={format_quantity(k, v)}" for k, v in sorted(res.items()))

    console = output_console()
    pods = Table(title="Pods (in the order they were placed)")
    for col in ("pod", "status", "node", "requests", "reason"):
        pods.add_column(col, overflow="fold")
    for p in report.pods:
        style = {"Scheduled": "green", "Unschedulable": "red"}.get(p.status, "yellow")
        # names and reasons are the user's text: "[...]" in them is not markup
        where = (p.node or "-") + (f" (GPU {','.join(map(str, p.devices))})" if p.devices else "")
        pods.add_row(escape(f"{p.namespace}/{p.name}"), f"[{style}]{p.status}[/]", escape(where),
                     fmt(p.requests), escape(p.reason))
    console.print(pods)
    nodes = Table(title="Nodes")
    for col in ("node", "allocatable", "requested"):
        nodes.add_column(col, overflow="fold")
    for n in report.nodes:
        nodes.add_row(escape(n["name"]), fmt(n["allocatable"]), fmt(n["requested"]))
    console.print(nodes)
