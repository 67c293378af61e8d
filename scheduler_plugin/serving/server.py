"""One uvicorn server on its own thread and event loop, and the TLS it serves.

uvicorn (httptools parser, uvloop event loop) in this process, each server on its own
thread and event loop; bounds in serving/limits.py and serving/protocol.py. Why uvicorn,
and the latency it was measured at: docs/scheduler.md, "HTTP server".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
import time
from typing import cast

import uvicorn
from uvicorn.config import Config as UvicornConfig
from uvicorn.server import Server as UvicornServer

from scheduler_plugin.serving import limits
from scheduler_plugin.serving.app import App
from scheduler_plugin.serving.protocol import ALPN_PROTOCOLS, AlpnProtocol, BoundedProtocol

# uvicorn warns once per malformed request: any client could flood the log with them
logging.getLogger("uvicorn.error").setLevel(logging.ERROR)
# uvicorn is a stand-in here (scheduler_plugin/__init__.py); uvicorn.lifespan.off imports
# `Config` from the package: naming it keeps the package __init__ (and click) unrun
uvicorn.__dict__.setdefault("Config", UvicornConfig)


def tls_context(
    cert_file: str, key_file: str, client_ca_file: str | None, *, http2: bool = False
) -> ssl.SSLContext:
    """TLS 1.2+ with this certificate; with a client CA, client certificates it signed are
    verified when offered (the extender verbs then require one, /debug takes one). With
    `http2`, ALPN offers h2 before http/1.1 (serving/http2.py; `--http2`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    # no TLS 1.3 session tickets: kube-scheduler's client keeps no session cache, so a
    # ticket is never used to resume, and issuing two per connection costs CPU
    ctx.num_tickets = 0
    if http2:
        ctx.set_alpn_protocols(ALPN_PROTOCOLS)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def requires_client_cert(tls: ssl.SSLContext | None) -> bool:
    return tls is not None and tls.verify_mode != ssl.CERT_NONE


class _Serving(UvicornServer):
    """uvicorn's server, then the app's own connections closed on the same loop."""

    def __init__(self, config: UvicornConfig, app: App) -> None:
        super().__init__(config)
        self._app = app

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets=sockets)
        finally:
            await self._app.close()


class Server:
    """One uvicorn server on its own thread and event loop. The socket is bound in the
    constructor, so a busy or forbidden address fails there (OSError)."""

    def __init__(self, address: tuple[str, int], app: App, *, tls: ssl.SSLContext | None) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(address)
        except OSError:
            self.sock.close()
            raise
        self.app = app
        self.tls = tls
        config = UvicornConfig(
            app,
            # over TLS the protocol is chosen by ALPN (HTTP/2 or HTTP/1.1)
            http=cast(type[asyncio.Protocol], AlpnProtocol if tls is not None else BoundedProtocol),
            loop="uvloop",
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            # no proxy sits in front: X-Forwarded-* would be client-written and unused
            proxy_headers=False,
            date_header=False,
            timeout_keep_alive=int(limits.KEEPALIVE_TIMEOUT),
            timeout_graceful_shutdown=1,
            backlog=128,
            ssl_context_factory=(lambda _cfg, _default: tls) if tls is not None else None,
        )
        self._server = _Serving(config, app)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> threading.Thread:
        thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self.sock]},
            daemon=True,
            name=f"http-{self.app.role}",
        )
        thread.start()
        self._thread = thread
        deadline = time.monotonic() + 10
        while not self._server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        if not self._server.started:
            raise OSError(f"the {self.app.role} server did not start")
        return thread

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        with contextlib.suppress(OSError):
            self.sock.close()
