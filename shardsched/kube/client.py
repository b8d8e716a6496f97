"""Connection to the API server: loading credentials, a token-bucket rate limiter, one request
helper, and the mapping of HTTP failures onto shardsched's typed errors.

Only this package imports ``kubernetes``. Requests go through the official client's `ApiClient`
(its auth, TLS and connection pool) but bodies are read as raw JSON, so objects arrive as camelCase
dicts exactly as the API server sent them (no model round trip; `to_dict` converts the few client
models we do build, with ``ApiClient.sanitize_for_serialization``). The per-pod writes (binds,
Events, conditions) use the client's asyncio variant instead (`shardsched.kube.aio`), with the
same credentials and the same typed errors.

Errors are decided by type (Kopf's rule), never by parsing messages:

======================  ===========================================================================
HTTP / transport         error raised
======================  ===========================================================================
401                      `Unauthorized` (PermanentError): credentials rejected
403 / 404 / 409 / 410    ``cluster.errors`` `Forbidden` (RBAC denied; the message names verb and
/ 422                    resource) / `NotFound` / `Conflict` / `Gone` / `Invalid`, the same types
                         the simulated cluster raises, so callers handle both backends alike
429, 500-503             `ServerError` (TemporaryError, ``delay_s`` from Retry-After when given)
504, read timeout        `Timeout` (TemporaryError): the request may or may not have been applied
connect failure, TLS     `Unreachable` (TemporaryError)
a body that is not JSON  `Garbage` (TemporaryError): logged by callers, never a crash
======================  ===========================================================================
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import orjson
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from shardsched.errors import PermanentError, TemporaryError
from shardsched.cluster import ApiError, Conflict, Forbidden, Gone, Invalid, NotFound, ServerError, Timeout

log = logging.getLogger(__name__)

#: kube-scheduler's client defaults (``clientConnection.qps``/``burst`` of KubeSchedulerConfiguration)
DEFAULT_QPS = 50.0
DEFAULT_BURST = 100

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class Unauthorized(ApiError, PermanentError):
    """401: the API server does not accept our credentials (expired token, wrong kubeconfig user)."""

    code = 401
    reason = "Unauthorized"


class Unreachable(TemporaryError):
    """The API server could not be reached (connection refused, DNS, TLS handshake)."""


class Garbage(TemporaryError):
    """The API server (or something in front of it) answered a body that is not the JSON expected."""


def to_dict(obj: Any) -> Any:
    """A client model (``V1Pod``, ...) or plain data as JSON-ready data with camelCase keys
    (``ApiClient.sanitize_for_serialization``: datetimes as RFC 3339 strings, None fields dropped).
    Dicts pass through unchanged."""
    if isinstance(obj, dict):
        return obj
    return k8s.ApiClient().sanitize_for_serialization(obj)


def _check_kubeconfig_shape(path: str) -> None:
    """Say plainly what is wrong with a kubeconfig that is not YAML, or whose top level is not a
    mapping (the client would fail on it with an unrelated TypeError).

    Raises: PermanentError naming the file, and the line for a YAML syntax error.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except UnicodeDecodeError as e:
        raise PermanentError(f"kubeconfig {path}: not a text file ({e.reason} at byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise PermanentError(f"kubeconfig {path}: not valid YAML{where}: {problem}") from None
    if doc is None:
        raise PermanentError(f"kubeconfig {path}: the file is empty")
    if not isinstance(doc, dict):
        raise PermanentError(f"kubeconfig {path}: not a kubeconfig: its YAML is a {type(doc).__name__}, expected a "
                             "mapping with clusters, contexts and users (apiVersion: v1, kind: Config)")


@dataclass(frozen=True)
class ClientSpec:
    """How to reach the API server; plain and picklable, so every process (the coordinator's, each
    shard actor's) builds its own client from it.

    Attributes:
        kubeconfig: path of a kubeconfig file; None = in-cluster config when running in a pod
            (service account token), else ``$KUBECONFIG`` or ``~/.kube/config``.
        context: kubeconfig context; None = its current-context.
        qps / burst: client-side rate limit of binding requests for the whole scheduler (token
            bucket: ``burst`` requests at once, refilled at ``qps`` per second); kube-scheduler's
            defaults 50/100. Split evenly over the shards (see `KubeCluster`).
        request_timeout_s: read timeout of one request (a bind that times out answers 504).
        connect_timeout_s: TCP/TLS connect timeout.
        user_agent: sent with every request (shows in the API server's audit log).
    """

    kubeconfig: str | None = None
    context: str | None = None
    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST
    request_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    user_agent: str = "shardsched"

    def configuration(self) -> k8s.Configuration:
        """Load credentials into a new client `Configuration`.

        Raises:
            PermanentError: the kubeconfig is missing, unreadable or invalid, or no configuration
                was found at all; the message says which file and why.
        """
        cfg = k8s.Configuration()
        path = self.kubeconfig
        try:
            if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                k8s_config.load_incluster_config(client_configuration=cfg)
                return cfg
            path = path or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
            if not os.path.exists(path):
                hint = "" if self.kubeconfig else (" (pass --kubeconfig, or run in a pod with a service account for "
                                                   "the in-cluster configuration)")
                raise PermanentError(f"kubeconfig {path}: no such file{hint}")
            if not os.access(path, os.R_OK):
                raise PermanentError(f"kubeconfig {path}: not readable by this user")
            _check_kubeconfig_shape(path)
            k8s_config.load_kube_config(config_file=path, context=self.context, client_configuration=cfg,
                                        persist_config=False)
        except ConfigException as e:
            raise PermanentError(f"kubeconfig {path or '(in-cluster)'}: {e}") from None
        except (OSError, yaml.YAMLError, ValueError, TypeError, AttributeError, KeyError) as e:  # unparsable YAML
            raise PermanentError(f"kubeconfig {path}: cannot be read: {type(e).__name__}: {e}") from None
        return cfg

    def api_client(self, pool_size: int = 16) -> k8s.ApiClient:
        """A new `ApiClient` with a connection pool of ``pool_size`` (>= the concurrent requests)."""
        cfg = self.configuration()
        cfg.connection_pool_maxsize = max(pool_size, 4)
        cfg.retries = 0  # retries are ours: typed, with backoff, never a silent POST replay
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook = _at_most_every(cfg.refresh_api_key_hook, TOKEN_REFRESH_S)
        api = k8s.ApiClient(cfg)
        api.user_agent = self.user_agent
        return api


#: how often a kubeconfig's token refresh hook runs at most (see `_at_most_every`)
TOKEN_REFRESH_S = 1.0


def _at_most_every(hook: Callable[[Any], None], period_s: float) -> Callable[[Any], None]:
    """Wrap the kubeconfig loader's ``refresh_api_key_hook`` so that it runs at most once per
    ``period_s``. The client calls the hook before every request; the loader's hook re-reads an
    expired exec/OIDC token (needed) and also writes ``host``, ``proxy``, ... back into the
    configuration, and the ``host`` setter scans the environment for proxies: about 0.3 ms of CPU
    per request, a third of a bind's cost. An expired token is still replaced within ``period_s``.
    """
    state = {"last": float("-inf"), "hook": hook}

    def hook_at_most_every(configuration: Any) -> None:
        now = time.monotonic()
        if now - state["last"] >= period_s:
            state["last"] = now
            state["hook"](configuration)
            # the loader's hook installs itself again each time it runs: keep ours in front
            installed = configuration.refresh_api_key_hook
            if installed is not hook_at_most_every:
                state["hook"] = installed
                configuration.refresh_api_key_hook = hook_at_most_every

    return hook_at_most_every


class TokenBucket:
    """client-go's ``flowcontrol.NewTokenBucketRateLimiter``: up to ``burst`` requests at once, then
    ``qps`` per second. Thread-safe; `acquire` blocks (like ``Wait``).

    Args:
        qps: refill rate, tokens per second; <= 0 disables the limit.
        burst: bucket size (>= 1).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take one token now or in the future; returns how long to wait, in seconds (0 = go)."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def acquire(self) -> float:
        """Block until a token is available; returns the seconds waited."""
        wait = self.reserve()
        if wait > 0:
            time.sleep(wait)
        return wait


def loads_json(data: bytes) -> Any:
    """An API server body or watch line as JSON: orjson (about 2.5x faster than the standard
    library on a pod with managedFields), and the standard library when orjson refuses (it rejects
    escaped lone surrogates, which are valid JSON). Raises ValueError when neither reads it
    (invalid UTF-8, not JSON)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        log.debug("orjson refused an answer (%s); reading it with json", e)
        return json.loads(data)


def _status_message(body: bytes | str | None) -> str:
    """The ``message`` of a ``metav1.Status`` body, or a short excerpt of whatever it was."""
    if not body:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:200]
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data["message"]
    return text.strip()[:200]


def classify(status: int, body: bytes | str | None, verb: str, resource: str,
             headers: Mapping[str, str] | None = None) -> ApiError | TemporaryError:
    """The typed error for an HTTP error answer to ``verb resource`` (table in the module docstring)."""
    msg = _status_message(body)
    what = f"{verb} {resource}"
    if status == 401:
        return Unauthorized(f"{what}: the API server rejected our credentials (401): {msg}")
    if status == 403:
        return Forbidden(f"RBAC denied: cannot {what} (403 Forbidden: {msg}); grant it to shardsched's "
                         "service account (deploy/rbac/02-clusterrole.yaml lists every verb needed)")
    if status == 404:
        return NotFound(f"{what}: {msg or 'not found'}")
    if status == 409:
        return Conflict(f"{what}: {msg or 'conflict'}")
    if status == 410:
        return Gone(f"{what}: {msg or 'resource version too old'}")
    if status in (400, 422):
        return Invalid(f"{what}: {msg}")
    if status == 504:
        return Timeout(f"{what}: {msg or 'the server timed out'}")
    if status == 429 or 500 <= status <= 599:
        err = ServerError(f"{what}: {status} {msg}")
        try:
            err.delay_s = max(0.1, float((headers or {}).get("Retry-After", 1)))
        except (TypeError, ValueError):
            err.delay_s = 1.0
        return err
    return ServerError(f"{what}: unexpected status {status}: {msg}")


def transport_error(exc: BaseException, verb: str, resource: str, host: str) -> TemporaryError:
    """The typed error for a request that got no HTTP answer."""
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return Timeout(f"{verb} {resource}: no answer from {host} in time")
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and isinstance(exc.reason, urllib3.exceptions.ReadTimeoutError):
        return Timeout(f"{verb} {resource}: no answer from {host} in time")
    reason = getattr(exc, "reason", None) or exc
    return Unreachable(f"{verb} {resource}: API server {host} unreachable: {type(reason).__name__}: {reason}")


class Api:
    """One API server connection: `request` for JSON calls, `stream` for watches, both rate-limited.

    Args:
        api_client: the official client (credentials, TLS, pool).
        bucket: the rate limiter every request takes a token from (None = unlimited).
        timeout_s: default (connect, read) timeouts in seconds.
    """

    def __init__(self, api_client: k8s.ApiClient, bucket: TokenBucket | None, timeout_s: tuple[float, float]) -> None:
        self.client = api_client
        self.bucket = bucket
        self.timeout_s = timeout_s
        self.host = api_client.configuration.host

    def send(self, method: str, path: str, query: Sequence[tuple[str, str]] | None, body: Any,
              content_type: str | None, timeout_s: tuple[float, float] | None, verb: str, resource: str):
        """Send one request through the client's generic call path and return its unread response
        (any status: the caller reads it and releases the connection). ``verb`` and ``resource``
        only name the request in errors.

        Raises: `Unreachable` or `Timeout` when no answer came.
        """
        if self.bucket is not None:
            self.bucket.acquire()
        headers = {"Accept": JSON}
        if body is not None:
            headers["Content-Type"] = content_type or JSON
        params = self.client.param_serialize(method=method, resource_path=path, query_params=list(query or ()),
                                             header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            return self.client.call_api(*params, _request_timeout=timeout_s or self.timeout_s)
        except ApiException as e:  # the client's own wrapper of TLS errors (status 0)
            raise Unreachable(f"{verb} {resource}: API server {self.host}: {e.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise transport_error(e, verb, resource, self.host) from None

    def request(self, method: str, path: str, *, verb: str, resource: str,
                query: Sequence[tuple[str, str]] | None = None, body: Any = None, content_type: str | None = None,
                timeout_s: tuple[float, float] | None = None) -> Any:
        """One JSON request; returns the decoded body (a dict for kube objects).

        Raises:
            the typed errors of the module docstring (`Forbidden`, `NotFound`, `Conflict`, `Gone`,
            `Invalid`, `ServerError`, `Timeout`, `Unreachable`, `Garbage`).
        """
        resp = self.send(method, path, query, body, content_type, timeout_s, verb, resource)
        try:
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise transport_error(e, verb, resource, self.host) from None
        finally:
            resp.response.release_conn()
        if not 200 <= resp.status <= 299:
            raise classify(resp.status, data, verb, resource, resp.headers)
        try:
            return loads_json(data) if data else {}
        except ValueError:
            raise Garbage(f"{verb} {resource}: the API server answered {resp.status} with a body that is not JSON: "
                          f"{data[:120]!r}") from None

    def stream(self, path: str, *, verb: str, resource: str, query: Sequence[tuple[str, str]],
               timeout_s: tuple[float, float]) -> "urllib3.BaseHTTPResponse":
        """Open a streaming GET (a watch); returns the unread urllib3 response (close it when done).

        Raises: as `request` for the opening answer.
        """
        resp = self.send("GET", path, query, None, None, timeout_s, verb, resource)
        if not 200 <= resp.status <= 299:
            try:
                data = resp.read()
            except (urllib3.exceptions.HTTPError, OSError):
                data = b""
            finally:
                resp.response.release_conn()
            raise classify(resp.status, data, verb, resource, resp.headers)
        return resp.response


def iter_lines(resp: "urllib3.BaseHTTPResponse") -> Iterator[bytes]:
    """The newline-separated lines of a streaming body (a watch), as they arrive."""
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while True:
            nl = buffer.find(b"\n")
            if nl < 0:
                break
            line, buffer = buffer[:nl], buffer[nl + 1:]
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer
