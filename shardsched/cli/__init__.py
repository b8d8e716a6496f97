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


class Quantity(click.ParamType):
    """A Kubernetes quantity of ``resource`` (``"500m"``, ``"16Gi"``), parsed at parse time with the
    project's parser (`canonical_quantity`): a malformed or negative value is a usage error (exit 2)
    naming the option, not a traceback once the run has started. The value stays the text given."""

    name = "quantity"

    def __init__(self, resource: str) -> None:
        self.resource = resource

    def convert(self, value, param, ctx):
        from shardsched.api.quantity import canonical_quantity
        from shardsched.errors import InvalidObjectError

        try:
            canonical_quantity(self.resource, value)
        except InvalidObjectError as e:
            self.fail(str(e), param, ctx)
        return value


class FiniteFloat(click.FloatRange):
    """A float within ``min``..``max`` (click's `FloatRange` arguments) that is also finite: ``nan``
    (which every comparison lets through) and ``inf`` are usage errors (exit 2) naming the option,
    as a value out of range is."""

    name = "float"

    def convert(self, value, param, ctx):
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def check_port_free(option: str, port: int, addr: str = "127.0.0.1") -> None:
    """Check that a server could listen on ``addr:port`` now (bound with ``SO_REUSEADDR``, as
    Python's HTTP servers bind), before anything else starts, rather than once Ray is up.

    Raises:
        ShardschedError: the port is taken or cannot be bound (message: the option, port, reason).
    """
    import socket

    from shardsched.errors import ShardschedError

    with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as e:
            raise ShardschedError(f"{option} {port}: {e.strerror or e} ({addr}:{port})") from None


#: ``--max-batch-size``'s help, in every command that has it
MAX_BATCH_SIZE_HELP = "Most pods a shard takes into one batch (with --batch-size 0, adaptive)."
#: ``--seed``'s help in the commands that run shards
SEED_HELP = "Seeds the random choices: between nodes of equal score, and the simulated API's bind errors and pod uids."

#: columns of a table printed to a file or a pipe (rich's default there is 80, which wraps it)
PIPE_WIDTH = 160


def output_console():
    """The rich Console for a command's tables on stdout: the terminal's width on a terminal,
    ``$COLUMNS`` when set, else `PIPE_WIDTH` columns."""
    import os

    from rich.console import Console

    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=PIPE_WIDTH)
    return console


def check_redis(url: str) -> None:
    """PING the Redis at ``url`` once, with a 2 s connect timeout and no retries.

    Raises:
        ShardschedError: it does not answer (message: where, without the password, and why).
    """
    import redis

    from shardsched.errors import ShardschedError
    from shardsched.store.server import connect

    client = connect(url, timeout_s=2.0, connect_timeout_s=2.0, retries=0)
    try:
        client.ping()
    except redis.RedisError as e:
        where = client.connection_pool.connection_kwargs
        at = where["path"] if "path" in where else f"{where.get('host')}:{where.get('port')}"
        raise ShardschedError(f"--redis-url: no Redis answers at {at}: {e}") from None
    finally:
        client.close()


def check_ray_address(address: str | None, timeout_s: float = 2.0) -> None:
    """Check that a Ray head's GCS accepts a TCP connection at ``address`` (``host:port``) within
    ``timeout_s``, before ``ray.init`` spends minutes retrying it. No-op for None, ``auto`` and
    ``ray://`` addresses (Ray client: its own, quick errors).

    Raises:
        ShardschedError: the address is not ``host:port``, or nothing accepts a connection there.
    """
    import socket

    from shardsched.errors import ShardschedError

    if address is None or address == "auto" or "://" in address:
        return
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ShardschedError(f"--ray-address {address!r}: expected HOST:PORT of a Ray head")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ShardschedError(f"--ray-address {address}: no Ray head answers there ({reason})") from None


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

    Raises: click.UsageError (exit status 2) when --min-shards is above --max-shards."""
    from shardsched.sharding.scaling import AutoscalerOptions

    if kw["autoscale"] and kw["min_shards"] > kw["max_shards"]:
        raise click.UsageError(f"--min-shards {kw['min_shards']} is above --max-shards {kw['max_shards']}")
    return AutoscalerOptions(min_shards=kw["min_shards"], max_shards=kw["max_shards"]) if kw["autoscale"] else None
