"""``python -m chaos``: list the chaos scenarios, or run one and print its verdict.

Exit status: 0 when every invariant held, 3 when one was violated (the verdict says which), 1 when
the scenario could not be loaded or run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys

import click

from chaos.scenario import ScenarioError, list_scenarios, load_scenario
from shardsched.errors import ShardschedError

EXIT_VIOLATED = 3


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """shardsched's chaos suite: fault scenarios (chaos/scenarios/*.yaml) run on the embedded
    runtime (local Ray, Redis, simulated cluster), judged against the invariants of docs/design.md."""
    logging.basicConfig(level=max(logging.WARNING - 10 * verbose, logging.DEBUG), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command("list")
def list_cmd() -> None:
    """The scenarios, with their faults."""
    try:
        scenarios = list_scenarios()
    except ScenarioError as e:
        raise click.ClickException(str(e)) from None
    for s in scenarios:
        faults = ", ".join(dict.fromkeys(f.action for f in s.faults)) or "none"
        click.echo(f"{s.name:18} {s.cluster.nodes:>5} nodes {s.workload.pods:>6} pods  faults: {faults}")
        click.echo(f"{'':18} {s.description.split('. ')[0].strip()}.")


@cli.command()
@click.argument("scenario")
@click.option("--short", is_flag=True, help="Run the scenario's short: version (what CI runs).")
@click.option("--redis-url", help="Use this Redis (only for scenarios that neither restart Redis nor need AOF).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def run(scenario: str, short: bool, redis_url: str | None, output: str) -> None:
    """Run SCENARIO (a name from `list`, or a path to a YAML file) and print its verdict."""
    from chaos.runner import ChaosRun

    try:
        spec = load_scenario(scenario, short=short)
    except ScenarioError as e:
        click.echo(str(e), err=True)
        sys.exit(1)
    import ray

    from shardsched.sharding.scaling import RAY_NAMESPACE

    # stdout carries the verdict only: the actors' logs stay in Ray's log files, and what Ray prints
    # on the driver (a worker killed on purpose, ...) goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING, configure_logging=False,
                 namespace=RAY_NAMESPACE)  # the run's detached actors live there (as `run`'s)
        try:
            verdict = ChaosRun(spec, redis_url=redis_url, short=short).run_verdict()
        except ShardschedError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        finally:
            ray.shutdown()
    data = verdict.to_json()
    if output == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        _table(data)
    sys.exit(0 if verdict.ok else EXIT_VIOLATED)


def _table(d: dict) -> None:
    m = d["metrics"]
    click.echo(f"scenario {d['scenario']}{' (short)' if d['short'] else ''}: "
               f"{'OK' if d['ok'] else 'VIOLATED'} in {d['wall_s']} s, settled={d['settled']}")
    for v in d["violations"]:
        click.echo(f"  violation: {v}")
    click.echo(f"  overcommitted_nodes={d['overcommitted_nodes']} double_binds={d['double_binds']} "
               f"stale_token_binds={d['stale_token_binds']} lost_pods={d['lost_pods']} recovery_s={d['recovery_s']}")
    p = d["pods_per_s"]
    click.echo(f"  pods/s before={p['before']} during={p['during']} after={p['after']}; pods {d['pods']}")
    for f in d["faults"]:
        click.echo(f"  fault {f['action']:16} at {f['at_s']:>6} s  recovery {f['recovery_s']} s  "
                   + " ".join(f"{k}={v}" for k, v in f.items() if k not in ("action", "at_s", "recovery_s")))
    for k in d["shard_kills"]:
        click.echo(f"  killed {k['member']} at {k['at_s']} s: {k['pods_counted']} pods bound within "
                   f"{k['bound_within_s']} s (limit {k['limit_s']})")
    click.echo(f"  requeues={m['requeues']} {m['requeues_by_reason']} conflicts={m['conflicts']} "
               f"replaced_shards={m['replaced_shards']} coordinator_restarts={m['coordinator_restarts']} "
               f"ledger_rebuilds={m['ledger_rebuilds']}")
    click.echo(f"  reserve failures {m['reserve_failures_by_code']}; fences {m['fence_verdicts']}; "
               f"admission {m['admission_rejections_by_cause']}")
    if d["rival"]:
        click.echo(f"  rival {d['rival']}")
    click.echo(f"  ledger {d['ledger']}")
    for e in d["errors"]:
        click.echo(f"  error: {e}")


if __name__ == "__main__":
    cli(prog_name="python -m chaos")
