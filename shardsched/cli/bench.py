"""``shardsched bench``: benchmarks, each measured in the run that prints it."""

from __future__ import annotations

import json

import click


@click.group()
def bench() -> None:
    """Benchmarks on this machine (figures are measured in the run that prints them).

    \b
    decision   the decision path alone (Filter/Score/select/assume), one process
    """


@bench.command()
@click.option("--nodes", type=click.IntRange(1), default=5000, show_default=True)
@click.option("--pods", type=click.IntRange(1), default=20000, show_default=True, help="Pods of the one-signature workload.")
@click.option("--distinct", type=click.IntRange(1), default=5000, show_default=True, help="Pods of the all-distinct workload.")
@click.option("--repeat", type=click.IntRange(1), default=3, show_default=True, help="Runs per workload; the best is reported.")
@click.option("--seed", type=int, default=0, show_default=True)
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
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"decision path, {nodes} nodes, one process (best of {repeat})")
    for col in ("workload", "pods", "scheduled", "decisions/s", "time"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.workload, str(r.pods), str(r.scheduled), f"{r.decisions_per_s:,.0f}", f"{r.best_s:.3f} s")
    console = Console()
    console.print(table)
    console.print(f"peak RSS of this process: {peak / 2**20:.0f} MiB")
