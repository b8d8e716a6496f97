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
