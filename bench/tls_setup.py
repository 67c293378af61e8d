"""What one new TLS connection to the extender's port costs tessera-scheduler, against one
request on a kept-alive connection: `python -m bench.tls_setup [CONNECTIONS]`.

kube-scheduler's extender client (Go, HTTP/1.1 here) keeps 2 idle connections per host,
so binds running side by side open new connections; this is what each one costs. The
server side uses tessera-scheduler's own TLS context (ECDSA P-256 keys, client
certificate verified as for the extender verbs); the CPU is the serving thread's own.
"""

from __future__ import annotations

import socket
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path

from scheduler_plugin.serving.server import tls_context
from tests.e2e.pki import Authority

REQUEST = b"y" * 600
ANSWER = b"x" * 200


def measure(count: int, *, client_cert: bool = True) -> dict[str, float]:
    """Server thread CPU (ms) per new connection + request, and per kept-alive request."""
    folder = Path(tempfile.mkdtemp(prefix="tessera-tls-"))
    ca = Authority(folder, "ca")
    server_pair = ca.issue("server", "tessera-scheduler", server=True)
    client_pair = ca.issue("client", "kube-scheduler")
    server_ctx = tls_context(
        str(server_pair.cert), str(server_pair.key), str(ca.path) if client_cert else None
    )
    client_ctx = ssl.create_default_context(cafile=str(ca.path))
    client_ctx.load_cert_chain(str(client_pair.cert), str(client_pair.key))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    address = listener.getsockname()
    out: dict[str, float] = {}

    def serve(kept: bool) -> None:
        start = time.thread_time()
        for _ in range(1 if kept else count):
            conn, _peer = listener.accept()
            tls = server_ctx.wrap_socket(conn, server_side=True)
            if kept:
                start = time.thread_time()  # the handshake is not counted
            for _ in range(count if kept else 1):
                tls.recv(4096)
                tls.sendall(ANSWER)
            tls.close()
        out["kept" if kept else "new"] = (time.thread_time() - start) * 1000 / count

    def client(kept: bool) -> None:
        for _ in range(1 if kept else count):
            raw = socket.create_connection(address)
            with client_ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                for _ in range(count if kept else 1):
                    tls.sendall(REQUEST)
                    tls.recv(4096)

    for kept in (False, True):
        server = threading.Thread(target=serve, args=(kept,))
        server.start()
        client(kept)
        server.join()
    listener.close()
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    count = int(args[0]) if args else 300
    with_cert = measure(count)
    without = measure(count, client_cert=False)
    print(
        f"server CPU per new connection and request: {with_cert['new']:.3f} ms "
        f"({without['new']:.3f} ms without a client certificate); per request on a "
        f"kept-alive connection: {with_cert['kept']:.3f} ms ({count} each)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
