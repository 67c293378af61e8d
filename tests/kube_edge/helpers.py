"""A stub HTTP(S) server that records each request and answers each path as told, and a
child Python process that reports in JSON (what a fresh process imports cannot be seen from
inside the test process)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.deviceplugin.conftest import ROOT

NOT_FOUND = (404, b'{"kind":"Status"}')
"""The answer for a path with none set."""


class StubServer(ThreadingHTTPServer):
    answers: dict[str, tuple[int, bytes]]
    """(status, payload) by request path."""
    seen: list[tuple[str, str, dict[str, str], bytes]]
    """(method, path, headers with lower-case names, body) of each request, in order."""


class _Handler(BaseHTTPRequestHandler):
    server: StubServer

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append(
            (self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        status, payload = self.server.answers.get(self.path, NOT_FOUND)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = _answer

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_stub(tls: ssl.SSLContext | None = None) -> Iterator[StubServer]:
    """A stub server on a free loopback port (HTTPS with `tls`), stopped on exit."""
    srv = StubServer(("127.0.0.1", 0), _Handler)
    if tls is not None:
        srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    srv.answers, srv.seen = {}, []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def run_probe(script: str, *args: str, **env: str) -> Any:
    """Run `script` in a fresh interpreter on this checkout, with `env` added to the
    environment; the JSON document its last line of output prints."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
