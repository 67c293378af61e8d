"""The simulated kubelet's view of one plugin: an endpoint dropped before its reader thread
opens the ListAndWatch stream ends quietly, as a kubelet drops a replaced plugin."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc

from tessera_testbed.kubelet import PluginEndpoint


def test_an_endpoint_closed_before_its_stream_opens_ends_quietly(tmp_path: Path) -> None:
    socket = tmp_path / "nobody.sock"
    endpoint = PluginEndpoint("tessera.dev/gpu", socket, grpc.insecure_channel(f"unix://{socket}"))
    endpoint.close()
    errors: list[BaseException | None] = []
    hook = threading.excepthook

    def record(args: threading.ExceptHookArgs) -> None:
        errors.append(args.exc_value)

    threading.excepthook = record
    try:
        endpoint.start_reading()
        endpoint.close()  # joins the reader
    finally:
        threading.excepthook = hook
    assert errors == []
    assert endpoint.stream_open is False
