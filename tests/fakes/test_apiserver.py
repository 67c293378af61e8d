"""The fake API server behaves like the real one where clients depend on it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.fakes.apiserver import FakeApiServer, merge_patch

GROUP, VERSION, PLURAL = "example.com", "v1", "widgets"
BASE = f"/apis/{GROUP}/{VERSION}"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        s.enable_status(BASE, PLURAL)
        yield s


@pytest.fixture
def custom(server: FakeApiServer) -> client.CustomObjectsApi:
    configuration = client.Configuration()
    configuration.host = server.url
    return client.CustomObjectsApi(client.ApiClient(configuration))


def _widget(name: str, size: int) -> dict:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size},
    }


def test_create_get_replace_conflict(custom: client.CustomObjectsApi) -> None:
    created = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _widget("w", 1))
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _widget("w", 1))
    assert err.value.status == 409
    stale = dict(created)
    created["spec"] = {"size": 2}
    replaced = custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "w", created)
    assert replaced["spec"] == {"size": 2}
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    stale["spec"] = {"size": 3}
    with pytest.raises(ApiException) as err:
        custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "w", stale)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "nope")
    assert err.value.status == 404


def test_status_subresource(custom: client.CustomObjectsApi, server: FakeApiServer) -> None:
    body = _widget("w", 1)
    body["status"] = {"ignored": True}
    obj = custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    assert "status" not in obj
    obj["status"] = {"used": 1}
    custom.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, "w", obj)
    obj = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "w")
    obj["spec"] = {"size": 5}
    obj["status"] = {"used": 999}  # ignored on the main resource
    obj = custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "w", obj)
    assert (obj["spec"], obj["status"]) == ({"size": 5}, {"used": 1})


def test_patches(server: FakeApiServer) -> None:
    server.put("/api/v1/namespaces/ns/configmaps/c", {"data": {"a": "1", "b": "2"}})
    out = server.handle(
        "PATCH",
        "/api/v1/namespaces/ns/configmaps/c",
        {},
        ("application/merge-patch+json", {"data": {"a": None, "c": "3"}}),
    )
    assert out["data"] == {"b": "2", "c": "3"}
    assert out["metadata"]["namespace"] == "ns"
    out = server.handle(
        "PATCH",
        "/api/v1/namespaces/ns/configmaps/c",
        {},
        ("application/json-patch+json", [{"op": "replace", "path": "/data/b", "value": "9"}]),
    )
    assert out["data"] == {"b": "9", "c": "3"}
    assert merge_patch({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}


def test_watch_with_the_kubernetes_client(custom: client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _widget("a", 1))
    seen: list[tuple[str, str]] = []
    started = threading.Event()
    done = threading.Event()

    def watcher() -> None:
        w = watch.Watch()
        for event in w.stream(
            custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout_seconds=5
        ):
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            started.set()
            if len(seen) == 3:
                w.stop()
        done.set()

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    assert started.wait(10)  # the watch is open (its first event is the existing object)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _widget("b", 2))
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "a")
    assert done.wait(10)
    assert seen[0] == ("ADDED", "a")
    assert seen[1:] == [("ADDED", "b"), ("DELETED", "a")]


def test_injected_failures(custom: client.CustomObjectsApi, server: FakeApiServer) -> None:
    server.fail_next("POST", BASE, 503)
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _widget("w", 1))
    assert err.value.status == 503
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _widget("w", 1))
    assert server.writes("POST") == [("POST", f"{BASE}/{PLURAL}")] * 2
