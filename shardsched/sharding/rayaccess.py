"""How another process reaches the Ray cluster of a running ``shardsched run`` or ``serve``: the
GCS address and Ray's token authentication.

A local Ray started by ``ray.init()`` has token authentication on by default, with a token that
Ray generates once into ``~/.ray/auth_token``. A process that joins it must send that token: Ray
reads it from ``$RAY_AUTH_TOKEN``, else the file ``$RAY_AUTH_TOKEN_PATH``, else
``~/.ray/auth_token`` (`TOKEN_SOURCES`), but only turns token authentication on by itself for
``address="auto"``; a process given the address (``--ray-address HOST:PORT``) sends no token and
is refused (``InvalidAuthToken``) unless ``RAY_AUTH_MODE=token`` is set. `enable_token_auth` does
for an explicit address what Ray does for ``auto``; `describe_access` says what the process that
started Ray uses, so that ``run`` can print it.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Ray's environment variable for the authentication mode ("token" or "disabled")
AUTH_MODE_ENV = "RAY_AUTH_MODE"
#: where Ray looks for the token, in its order: the token itself, a file naming it, the default file
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"
TOKEN_SOURCES = f"${TOKEN_ENV}, the file ${TOKEN_PATH_ENV}, {DEFAULT_TOKEN_PATH}"


def token_source() -> str | None:
    """Where this process's token comes from, as Ray looks for it (`TOKEN_SOURCES`): ``"$RAY_AUTH_TOKEN"``,
    a file's path, or None when there is none (a file named by ``$RAY_AUTH_TOKEN_PATH`` that cannot
    be read counts as none: Ray refuses it rather than fall back to the default file)."""
    if os.environ.get(TOKEN_ENV):
        return f"${TOKEN_ENV}"
    path = Path(os.environ[TOKEN_PATH_ENV]).expanduser() if os.environ.get(TOKEN_PATH_ENV) else DEFAULT_TOKEN_PATH
    return str(path) if path.is_file() else None


def enable_token_auth() -> bool:
    """Before ``ray.init(address=...)`` of a cluster started elsewhere: turn Ray's token
    authentication on for this process when ``$RAY_AUTH_MODE`` is not set and a token is found
    (`token_source`), as Ray itself does for ``address="auto"``. An explicit ``$RAY_AUTH_MODE`` is
    kept. Returns whether token authentication is on."""
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None:
        return mode.lower() == "token"
    if token_source() is None:
        return False
    from ray._raylet import Config

    os.environ[AUTH_MODE_ENV] = "token"
    Config.initialize("")  # Ray caches its configuration: read the environment again
    return True


def describe_access() -> tuple[str, str]:
    """How another process joins the Ray this process is connected to (call after ``ray.init``):
    its GCS address (``HOST:PORT``) and its authentication in words (``token authentication, token
    in ~/.ray/auth_token``, or ``no token authentication``)."""
    import ray
    from ray._raylet import AuthenticationMode, get_authentication_mode

    address = ray.get_runtime_context().gcs_address
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        return address, "no token authentication"
    source = token_source()
    where = f"${TOKEN_ENV} of this process" if source == f"${TOKEN_ENV}" else source
    return address, f"token authentication, token in {where}"


def connected() -> bool:
    """Whether this process is connected to Ray (``ray.init`` ran and no ``shutdown`` since)."""
    import ray

    return ray.is_initialized()


def init(address: str | None, namespace: str) -> str:
    """Connect this process to Ray: join the cluster at ``address`` (``HOST:PORT``, or ``auto``),
    or start a local one when ``address`` is None; the job in ``namespace``, where the run's named
    (and detached) actors live; no dashboard, Ray's logs at WARNING, workers' output to this
    process. Returns the GCS address. Raises what ``ray.init`` raises (many types)."""
    import logging

    import ray

    ray.init(address=address, namespace=namespace, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=True, configure_logging=False)
    return ray.get_runtime_context().gcs_address


def start_or_join_local(namespace: str) -> tuple[str, bool]:
    """This process's Ray: the one it is connected to, else a new local one in ``namespace``
    (`init`). Returns its GCS address and whether it was started here (then `shutdown` ends it)."""
    import ray

    if ray.is_initialized():
        return ray.get_runtime_context().gcs_address, False
    return init(None, namespace), True


def shutdown() -> None:
    """Disconnect this process from Ray, ending a Ray it started."""
    import ray

    ray.shutdown()


def refused_hint(address: str) -> str:
    """What to do when Ray at ``address`` refused this process's token (``InvalidAuthToken``),
    naming what this process had: no token, token authentication turned off, or a token that is
    not the cluster's."""
    mode = os.environ.get(AUTH_MODE_ENV)
    source = token_source()
    if mode is not None and mode.lower() != "token":
        return (f"Ray at {address} requires its authentication token, and {AUTH_MODE_ENV}={mode} here sends none: "
                f"unset {AUTH_MODE_ENV}")
    if source is None:
        looked = (f"${TOKEN_PATH_ENV} names {os.environ[TOKEN_PATH_ENV]}, which is not a file" if os.environ.get(TOKEN_PATH_ENV)
                  else f"none was found here (looked for {TOKEN_SOURCES})")
        return (f"Ray at {address} requires its authentication token, and {looked}: give the token that "
                f"`shardsched run` names, with {TOKEN_PATH_ENV}=FILE")
    return (f"Ray at {address} refused the authentication token from {source}: it is not this cluster's; give the "
            f"token that `shardsched run` names, with {TOKEN_PATH_ENV}=FILE or {TOKEN_ENV}")
