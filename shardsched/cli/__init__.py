"""The ``shardsched`` command line (`shardsched.cli.main`) and what its subcommands share."""

from __future__ import annotations

import click


def redis_url_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """click callback of ``--redis-url``: the URL must parse as redis-py parses it (``redis://``,
    ``rediss://`` or ``unix://``); otherwise a usage error (exit 2) instead of a traceback later."""
    if value is None:
        return None
    import redis

    try:
        redis.connection.parse_url(value)
    except ValueError as e:
        raise click.BadParameter(f"{value!r}: {e}") from None
    return value


def autoscale_options(autoscale_note: str = "", max_shards_help: str = "With --autoscale."):
    """The ``--autoscale``, ``--min-shards`` and ``--max-shards`` options of ``run`` and ``serve``
    (read back with `autoscaler_from`); ``autoscale_note`` ends ``--autoscale``'s help."""
    def decorate(command):
        for option in reversed([
            click.option("--autoscale", is_flag=True,
                         help="Let the coordinator set the shard count from pending pods per shard and scheduling "
                              f"latency, within --min-shards and --max-shards{autoscale_note}."),
            click.option("--min-shards", type=click.IntRange(1, 64), default=1, show_default=True,
                         help="With --autoscale."),
            click.option("--max-shards", type=click.IntRange(1, 64), default=8, show_default=True,
                         help=max_shards_help),
        ]):
            command = option(command)
        return command

    return decorate


def autoscaler_from(kw: dict):
    """`AutoscalerOptions` from the options of `autoscale_options`, or None without --autoscale.

    Raises: ValueError for an inconsistent range (min above max)."""
    from shardsched.sharding.scaling import AutoscalerOptions

    return AutoscalerOptions(min_shards=kw["min_shards"], max_shards=kw["max_shards"]) if kw["autoscale"] else None
