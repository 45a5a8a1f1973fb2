"""Where a webhook delivery connects: to the address it checked, and only to one kiln may reach.

A check of the URL's name before the request (``core.webhooks.target_refusal``) is not enough: the HTTP client
would resolve the name again to connect, and a name server may answer a public address to the check and
127.0.0.1 to the connection (DNS rebinding). So the notifier's HTTP client connects through ``GuardedBackend``, an
``httpcore`` network backend: for each new connection it resolves the name once, refuses it if any address it
resolves to is refused (``core.webhooks.address_refusal``), connects to the checked address itself, and checks the
peer of the connected socket again. The URL's name stays what the request says: the Host header, and the SNI and
certificate check of TLS, which ``httpcore`` takes from the request's URL, not from the address connected to.
Redirects are not followed (``scheduler.live.notifier``), and no proxy from the environment is used: a proxy would
resolve the name itself.

``KILN_WEBHOOK_ALLOW_PRIVATE_TARGETS=true`` connects as any client does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

from core.webhooks import ALLOW_PRIVATE_HINT, address_refusal, checked_addresses


class RefusedTarget(httpcore.ConnectError):
    """A connection kiln will not make; httpx raises it as ``httpx.ConnectError`` (this as its ``__cause__``)."""


class GuardedBackend(httpcore.NetworkBackend):
    """``httpcore``'s blocking backend, connecting only to checked, globally reachable addresses."""

    def __init__(self, *, allow_private: bool, inner: httpcore.NetworkBackend | None = None) -> None:
        self.allow_private = allow_private
        self.inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if self.allow_private:
            return self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        addresses, why = checked_addresses(host, port)
        if why is not None:
            raise RefusedTarget(why) if addresses else httpcore.ConnectError(why)
        failure: httpcore.ConnectError | httpcore.ConnectTimeout | None = None
        for address in addresses:
            try:
                stream = self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            peer = stream.get_extra_info("server_addr")
            why = address_refusal(str(peer[0])) if peer else f"{address}, whose peer address cannot be read"
            if why is not None:
                stream.close()
                raise RefusedTarget(f"{host} connected to {why} ({ALLOW_PRIVATE_HINT})")
            return stream
        raise failure or httpcore.ConnectError(f"{host} resolves to no address")

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise RefusedTarget("webhooks are not sent to a Unix socket")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's transport over a connection pool whose connections ``GuardedBackend`` makes. httpx takes no network
    backend, so the pool it built is replaced by the same pool with this one (``handle_request`` uses ``_pool``)."""

    def __init__(self, *, allow_private: bool, limits: httpx.Limits | None = None) -> None:
        limits = limits or httpx.Limits(max_connections=20, max_keepalive_connections=10, keepalive_expiry=5.0)
        super().__init__(trust_env=False, limits=limits)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(allow_private=allow_private),
        )


def refusal_of(exc: BaseException) -> str | None:
    """What ``GuardedBackend`` said when it refused the connection behind ``exc``, or None."""
    cause = exc.__cause__
    return str(cause) if isinstance(cause, RefusedTarget) else None
