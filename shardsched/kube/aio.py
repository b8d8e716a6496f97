"""The per-pod requests (binds, Events, pod conditions) over the official client's asyncio variant.

A burst of pending pods costs two writes per pod (the bind and its ``Scheduled`` Event). Through
the blocking client (urllib3 and ``http.client`` on a thread pool) one such request costs about
0.45 ms of CPU; through ``kubernetes.aio`` (the official client's asyncio API on aiohttp, whose
HTTP parser is compiled) about 0.23 ms, with many requests in flight on one thread instead of one
thread per request (docs/kubernetes.md, Benchmark). `AioApi` runs that client on an event loop in
a daemon thread of its own and offers:

- ``await arequest(...)`` for coroutines running on its loop (`KubeCluster.bind_many` gathers its
  binds there), and ``run(coro)`` to run one from any other thread and wait for it;
- ``request(...)``: the blocking call with the contract of `shardsched.kube.client.Api.request`
  (same arguments, same typed errors), so the Event and condition writers use it unchanged.

Credentials are those `ClientSpec.configuration` loads (kubeconfig or in-cluster, the same
errors): host, CA, client certificate, ``insecure-skip-tls-verify``, ``tls-server-name``, the proxy
(the blocking configuration resolves ``proxy-url`` and the proxy environment variables once) and
the bearer token, refreshed through the loader's hook at most once a second (``_at_most_every``).
The session does not read the environment itself (``trust_env`` off): with it on, aiohttp looks
up ``.netrc`` and the proxy variables in a worker thread for every request, which doubled the CPU
per request. Requests are never retried by the client (``retries`` off): retries are ours, typed.

Transport failures map as in the blocking `Api`: a connect failure or TLS error is `Unreachable`
(not applied); a read timeout is `Timeout` (may have been applied); a connection that breaks while
the answer is read is `Unreachable`, as the blocking client reports it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
import time
from typing import Any, Coroutine, Mapping, Sequence, TypeVar

import aiohttp
from kubernetes.aio import client as aio_k8s
from kubernetes.aio.client import rest as aio_rest

from shardsched.kube.client import JSON, TOKEN_REFRESH_S, ClientSpec, Garbage, TokenBucket, Unreachable, \
    _at_most_every, classify, loads_json
from shardsched.cluster import Timeout

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long an idle connection is kept open for the next request, in seconds: client-go's
#: ``IdleConnTimeout`` (k8s.io/apimachinery/pkg/util/net ``SetTransportDefaults``), where aiohttp's
#: own default is 15 s; a burst after a quiet minute then finds its connections open
IDLE_CONNECTION_S = 90.0


class _KeepAliveRest(aio_rest.RESTClientObject):
    """The official client's REST object with idle connections kept for `IDLE_CONNECTION_S`
    (``_create_connector`` is the client's hook for it; the pool's size and TLS are the client's)."""

    def _create_connector(self) -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(limit=self.maxsize, ssl=self.ssl_context, keepalive_timeout=IDLE_CONNECTION_S)


def transport_error(exc: BaseException, verb: str, resource: str, host: str) -> Timeout | Unreachable:
    """The typed error for an aiohttp request that got no (complete) HTTP answer.

    A connect timeout is `Unreachable` (nothing was sent); a read timeout is `Timeout` (the request
    may have been applied); everything else (refused, DNS, TLS, a dropped connection) `Unreachable`.
    """
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return Unreachable(f"{verb} {resource}: API server {host} unreachable: connect timed out")
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return Timeout(f"{verb} {resource}: no answer from {host} in time")
    return Unreachable(f"{verb} {resource}: API server {host} unreachable: {type(exc).__name__}: {exc}")


def aio_configuration(spec: ClientSpec, pool_size: int) -> aio_k8s.Configuration:
    """A ``kubernetes.aio`` `Configuration` with the credentials of ``spec.configuration()``.

    Raises: `PermanentError` as `ClientSpec.configuration` (missing or invalid kubeconfig).
    """
    sync = spec.configuration()
    if sync.refresh_api_key_hook is not None:
        sync.refresh_api_key_hook = _at_most_every(sync.refresh_api_key_hook, TOKEN_REFRESH_S)
    cfg = aio_k8s.Configuration()
    cfg.host = sync.host
    for name in ("ssl_ca_cert", "cert_file", "key_file", "verify_ssl", "tls_server_name", "proxy", "proxy_headers",
                 "disable_strict_ssl_verification"):
        if hasattr(sync, name):
            setattr(cfg, name, getattr(sync, name))
    cfg.api_key = dict(sync.api_key)
    cfg.api_key_prefix = dict(sync.api_key_prefix)
    if sync.refresh_api_key_hook is not None:
        def refresh(aio_cfg: aio_k8s.Configuration) -> None:
            # the blocking loader's hook re-reads an expired exec/OIDC token into ``sync`` (at most
            # once a second, see _at_most_every); copy what it holds now
            sync.get_api_key_with_prefix("BearerToken")
            aio_cfg.api_key = dict(sync.api_key)
            aio_cfg.api_key_prefix = dict(sync.api_key_prefix)
        cfg.refresh_api_key_hook = refresh
    cfg.connection_pool_maxsize = max(4, pool_size)
    cfg.retries = None
    cfg.client_session_kwargs = {"trust_env": False}
    return cfg


class AioApi:
    """One API server connection on an asyncio loop (module docstring).

    Args:
        spec: credentials and timeouts (``connect_timeout_s``, ``request_timeout_s``).
        bucket: the rate limiter every request takes a token from (None = unlimited); a view made
            by `with_bucket` shares the loop and connections under another limiter.
        pool_size: most connections open at once (requests beyond it wait for one).
        name: the loop thread's name.

    Raises: `PermanentError` (kubeconfig) from the constructor.
    """

    def __init__(self, spec: ClientSpec, bucket: TokenBucket | None = None, pool_size: int = 32,
                 name: str = "kube-aio") -> None:
        self.spec = spec
        self.bucket = bucket
        self.timeout_s = (spec.connect_timeout_s, spec.request_timeout_s)
        cfg = aio_configuration(spec, pool_size)
        self.host = cfg.host
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._shared = {"closed": False}  # shared with the views of `with_bucket`
        self._thread.start()
        self.client: aio_k8s.ApiClient = self.run(self._make_client(cfg))

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _make_client(self, cfg: aio_k8s.Configuration) -> aio_k8s.ApiClient:
        client = aio_k8s.ApiClient(cfg)
        client.rest_client = _KeepAliveRest(cfg)
        client.user_agent = self.spec.user_agent
        return client

    def with_bucket(self, bucket: TokenBucket | None) -> "AioApi":
        """A view of this connection (same loop, client and pool) under another rate limiter."""
        view = object.__new__(AioApi)
        view.__dict__.update(self.__dict__)
        view.bucket = bucket
        return view

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's).

        Raises: `Unreachable` once the connection is closed (also for a call that was waiting when
        `close` cancelled it), and whatever ``coro`` raises."""
        if self._shared["closed"]:
            coro.close()
            raise Unreachable(f"API server {self.host}: the connection is closed (shardsched is stopping)")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                return future.result(wait)
            except concurrent.futures.CancelledError:
                raise Unreachable(f"API server {self.host}: request cancelled (shardsched is stopping)") from None
            except concurrent.futures.TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if self._shared["closed"] and not self.loop.is_running():  # never to be answered
                    future.cancel()
                    raise Unreachable(f"API server {self.host}: the connection is closed (shardsched is stopping)") from None

    async def send(self, method: str, path: str, *, verb: str, resource: str,
                   query: Sequence[tuple[str, str]] | None = None, body: Any = None, content_type: str | None = None,
                   timeout_s: tuple[float, float] | None = None) -> tuple[int, Mapping[str, str], bytes]:
        """Send one request on the loop and read its whole answer: (status, headers, body bytes),
        any status.

        Raises: `Unreachable` or `Timeout` when no complete answer came (`transport_error`).
        """
        if self.bucket is not None:
            wait = self.bucket.reserve()
            if wait > 0:
                await asyncio.sleep(wait)
        headers = {"Accept": JSON, "Content-Type": content_type or JSON}
        connect_s, read_s = timeout_s or self.timeout_s
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=read_s)
        try:
            params = await self.client.param_serialize(method=method, resource_path=path,
                                                       query_params=list(query or ()), header_params=headers,
                                                       body=body, auth_settings=["BearerToken"])
            resp = await self.client.call_api(*params, _request_timeout=timeout)
            try:
                data = await resp.read()
            finally:
                resp.response.release()
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError, ssl.SSLError) as e:
            raise transport_error(e, verb, resource, self.host) from None
        return resp.status, resp.headers, data

    async def arequest(self, method: str, path: str, *, verb: str, resource: str,
                       query: Sequence[tuple[str, str]] | None = None, body: Any = None,
                       content_type: str | None = None, timeout_s: tuple[float, float] | None = None) -> Any:
        """`send`, then the decoded body, or the typed error of a non-2xx answer
        (`shardsched.kube.client.classify`; `Garbage` for a 2xx body that is not JSON)."""
        status, headers, data = await self.send(method, path, verb=verb, resource=resource, query=query, body=body,
                                                content_type=content_type, timeout_s=timeout_s)
        if not 200 <= status <= 299:
            raise classify(status, data, verb, resource, headers)
        try:
            return loads_json(data) if data else {}
        except ValueError:
            raise Garbage(f"{verb} {resource}: the API server answered {status} with a body that is not JSON: "
                          f"{data[:120]!r}") from None

    def request(self, method: str, path: str, *, verb: str, resource: str,
                query: Sequence[tuple[str, str]] | None = None, body: Any = None, content_type: str | None = None,
                timeout_s: tuple[float, float] | None = None) -> Any:
        """Blocking `arequest`, with the contract of `shardsched.kube.client.Api.request`."""
        return self.run(self.arequest(method, path, verb=verb, resource=resource, query=query, body=body,
                                      content_type=content_type, timeout_s=timeout_s))

    async def open_connections(self, count: int) -> int:
        """Open up to ``count`` connections now (``count`` concurrent ``GET /version``, readable by
        every client), so that the first burst of binds does not wait for TLS handshakes; they stay
        open for `IDLE_CONNECTION_S`. Not rate limited. Returns how many answered; never raises."""
        view = self.with_bucket(None)

        async def one() -> bool:
            try:
                status, _, _ = await view.send("GET", "/version", verb="get", resource="version",
                                               timeout_s=(self.timeout_s[0], min(self.timeout_s[1], 5.0)))
            except (Timeout, Unreachable):
                return False
            return 200 <= status <= 299

        return sum(await asyncio.gather(*(one() for _ in range(max(0, count)))))

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:  # requests still in flight: their callers get `Unreachable`
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.client.close()

    def close(self) -> None:
        """Cancel the requests in flight, close the connections and stop the loop (idempotent;
        views share it). Later calls raise `Unreachable`."""
        if self._shared["closed"]:
            return
        self._shared["closed"] = True  # from now on `run` refuses new calls
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(5)
        except Exception as e:  # noqa: BLE001 - closing is best effort
            log.debug("closing the aio client: %s", e)
        self.loop.call_soon_threadsafe(self.loop.stop)
