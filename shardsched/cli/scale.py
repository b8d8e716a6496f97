"""``shardsched scale``: change the number of shards of a running shardsched (``run`` or ``serve``)."""

from __future__ import annotations

import json
import sys

import click

from shardsched.errors import ShardschedError
from shardsched.sharding.scaling import COORDINATOR_NAME, RAY_NAMESPACE


@click.command()
@click.option("--shards", type=click.IntRange(1, 64), default=None,
              help="The new shard count. Without it: show the current count and the steps so far.")
@click.option("--ray-address", default=None,
              help="The Ray cluster where shardsched runs (default: auto, the Ray started last on this machine, "
                   "or the head of the Ray pod it runs in; pass the address when several run here).")
@click.option("--name", default=COORDINATOR_NAME, show_default=True,
              help=f"The coordinator's Ray actor name (Ray namespace: {RAY_NAMESPACE}).")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Give up waiting after this many seconds (new shards may wait for Ray to add a worker).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
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
    With the autoscaler on (`run --autoscale`), the count set here holds until its next decision.
    Exit status 0 on success, 1 when the coordinator cannot be found or the step failed.
    """
    import ray

    from shardsched.sharding.actors import find_coordinator

    from shardsched.cli import check_ray_address
    from shardsched.sharding.actors import NoRayError

    try:
        check_ray_address(ray_address)
        coordinator = find_coordinator(ray_address, name)
        if shards is None:
            status, history = ray.get([coordinator.status.remote(), coordinator.scale_history.remote()],
                                      timeout=timeout_s)
            result = {"shards": status["shards"], "epoch": status["epoch"], "pending": status["pending"],
                      "autoscaler": status.get("autoscaler", False), "steps": history}
        else:
            result = ray.get(coordinator.scale.remote(shards), timeout=timeout_s)
    except NoRayError as e:
        click.echo(f"error: {e}; when it runs on another machine, pass --ray-address HOST:PORT", err=True)
        sys.exit(1)
    except ShardschedError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except ray.exceptions.RayTaskError as e:
        click.echo(f"error: scaling failed: {e.cause if e.cause is not None else e}", err=True)
        sys.exit(1)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as e:
        click.echo(f"error: the coordinator did not answer: {type(e).__name__}", err=True)
        sys.exit(1)
    if output == "json":
        click.echo(json.dumps(result, indent=2))
    elif shards is None:
        auto = ", autoscaler on" if result["autoscaler"] else ""
        click.echo(f"{result['shards']} shards (epoch {result['epoch']}{auto}), {result['pending']} pods pending")
        for step in result["steps"]:
            click.echo(describe(step))
    else:
        click.echo(describe(result))


def describe(step: dict) -> str:
    """One line for a scale step (`ScaleStep.to_json`)."""
    if step["from_shards"] == step["to_shards"]:
        n = step["to_shards"]
        return f"already {n} shard{'' if n == 1 else 's'}: nothing to do"
    return (f"shards {step['from_shards']} -> {step['to_shards']} ({step['trigger']}, epoch {step['epoch']}): "
            f"{step['nodes_moved']} of {step['nodes']} nodes moved ({step['moved_fraction']:.3f}, ideal "
            f"{step['ideal_fraction']:.3f}), {step['pods_rerouted']} queued pods routed again; new shards started in "
            f"{step['start_s']:.2f} s, handover {step['handover_s']:.3f} s")
