"""The informer: paged list, watch from its resourceVersion with bookmarks, relist on 410
Gone, backoff with jitter, and each object decoded and handled on its own."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from kube_edge.informer import Handler, Informer, wait_synced
from tessera_testbed.apiserver import FakeApiServer


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


class Recorder(Handler):
    def __init__(self, fail_on: str = "") -> None:
        self.lists: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.fail_on = fail_on
        self.changed = threading.Condition()

    def replace(self, items: Iterable[dict[str, Any]]) -> None:
        names = [i["metadata"]["name"] for i in items]
        with self.changed:
            self.lists.append(names)
            self.changed.notify_all()

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name == self.fail_on:
            raise RuntimeError("a handler bug")
        with self.changed:
            self.events.append((kind, name))
            self.changed.notify_all()

    def wait(self, check: Any, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not check():
                left = deadline - time.monotonic()
                assert left > 0, f"timed out: lists={self.lists} events={self.events}"
                self.changed.wait(left)


def informer(url: str, handler: Handler, **kw: Any) -> Informer:
    return Informer(
        KubeClient.for_host(url, timeout=5), "/api/v1/nodes", handler, name="nodes", **kw
    )


def test_paged_list_then_events_in_order(fake: FakeApiServer) -> None:
    for i in range(5):
        fake.create("nodes", node(f"n{i}"))
    rec = Recorder(fail_on="boom")
    inf = informer(fake.url, rec, page_size=2)
    inf.start()
    try:
        assert wait_synced([inf], timeout=15)
        assert rec.lists == [["n0", "n1", "n2", "n3", "n4"]]
        assert fake.list_calls == 3  # pages of 2
        fake.create("nodes", node("n5"))
        fake.create("nodes", node("boom"))  # the handler raises on this one: skipped
        fake.patch("nodes", "n0", {"metadata": {"labels": {"a": "b"}}})
        fake.delete("nodes", "n1")
        rec.wait(lambda: len(rec.events) == 3)
        assert rec.events == [("ADDED", "n5"), ("MODIFIED", "n0"), ("DELETED", "n1")]
    finally:
        inf.stop()


def test_410_gone_relists_and_the_relist_replaces(fake: FakeApiServer) -> None:
    fake.create("nodes", node("a"))
    relisted: list[str] = []
    rec = Recorder()
    inf = informer(fake.url, rec, on_relist=relisted.append)
    inf.start()
    try:
        assert wait_synced([inf], timeout=15)
        fake.stop()  # the server goes; b comes and a goes while nobody watches,
        fake.create("nodes", node("b"))
        fake.delete("nodes", "a")
        fake.compact()  # and the history is compacted: the watch gets 410 Expired
        fake.start()
        rec.wait(lambda: len(rec.lists) >= 2)
        assert rec.lists[-1] == ["b"] and relisted == ["nodes"] * len(rec.lists)
        assert inf.relists == len(rec.lists)
    finally:
        inf.stop()


def test_bookmarks_move_the_resource_version_without_events(fake: FakeApiServer) -> None:
    fake.bookmark_interval = 0.2
    rec = Recorder()
    inf = informer(fake.url, rec)
    inf.start()
    try:
        assert wait_synced([inf], timeout=15)
        listed = inf.resource_version
        fake.create("leases", {"metadata": {"name": "x", "namespace": "ns"}})  # other kind
        deadline = time.monotonic() + 15
        while inf.resource_version == listed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert int(inf.resource_version) > int(listed)
        assert rec.events == []
    finally:
        inf.stop()


# --- hostile streams: a server that sends what the real one would not -----------------------


class _Stream(ThreadingHTTPServer):
    daemon_threads = True
    list_body: bytes
    watch_lines: list[bytes]
    paths: list[str]


class _StreamHandler(BaseHTTPRequestHandler):
    server: _Stream

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        watching = "watch=true" in self.path
        if watching:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for line in self.server.watch_lines:
                self.wfile.write(line + b"\n")
            self.wfile.flush()
            time.sleep(0.3)  # then the server ends the watch
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.list_body)))
        self.end_headers()
        self.wfile.write(self.server.list_body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stream() -> Iterator[_Stream]:
    srv = _Stream(("127.0.0.1", 0), _StreamHandler)
    srv.paths = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = {"a": value}
    return value


def test_a_bad_object_never_stops_the_list_or_the_watch(stream: _Stream) -> None:
    deep = node("deep")
    deep["spec"] = _deep(100)
    stream.list_body = json.dumps(
        {"metadata": {"resourceVersion": "7"}, "items": [node("a"), "junk", deep, node("b")]}
    ).encode()
    good = {"type": "ADDED", "object": node("c")}
    stream.watch_lines = [
        b"{not json",
        json.dumps({"type": "ADDED", "object": "not an object"}).encode(),
        b'{"type": "ADDED", "object": {"metadata": {"name": "d", "n": 1' + b"0" * 30 + b"}}}",
        json.dumps(good).encode(),
    ]
    rec = Recorder()
    inf = informer(f"http://127.0.0.1:{stream.server_address[1]}", rec)
    inf.list_once()
    assert rec.lists == [["a", "deep", "b"]] and inf.resource_version == "7"
    assert inf.watch_once() is False
    assert rec.events == [("ADDED", "c")]
    watch = stream.paths[-1]
    assert "resourceVersion=7" in watch and "allowWatchBookmarks=true" in watch
    assert inf.skipped == 1 + 3  # junk in the list; three event lines


def test_an_error_event_asks_for_a_relist(stream: _Stream) -> None:
    stream.list_body = json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    stream.watch_lines = [json.dumps({"type": "ERROR", "object": gone}).encode()]
    inf = informer(f"http://127.0.0.1:{stream.server_address[1]}", Recorder())
    inf.list_once()
    assert inf.watch_once() is True


class _Counted(Informer):
    """Records the pauses between failed attempts; stops after a few."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.pauses: list[float] = []

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        if len(self.pauses) >= 8:
            self.stop()


def test_failures_back_off_doubling_with_jitter_up_to_a_cap(
    fake: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kube_edge import informer as module

    fake.stop()  # every list fails: no answer
    draws = iter([0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.99, 0.0])
    monkeypatch.setattr(random, "random", lambda: next(draws))
    inf = _Counted(KubeClient.for_host(fake.url, timeout=1), "/api/v1/nodes", Recorder(), name="n")
    inf._run()
    start, cap = module.BACKOFF_START, module.BACKOFF_CAP
    assert inf.pauses[:3] == pytest.approx([start, start * 2 * 2, start * 4 * 1.5])
    assert inf.pauses[-1] == pytest.approx(cap * 1.0)
    assert not inf.synced.is_set()


def test_a_failed_list_is_an_api_error_with_the_status(fake: FakeApiServer) -> None:
    fake.fail("/api/v1/nodes", method="GET", status=500)
    inf = informer(fake.url, Recorder())
    with pytest.raises(ApiError) as failed:
        inf.list_once()
    assert failed.value.status == 500 and failed.value.transient
    inf.list_once()
    assert inf.synced.is_set()
