"""The simulated API server behaves like the real one where clients depend on it, and its test
helpers (find, writes, parse_path, the `before` hook) do what they say."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kube_edge import config as kube_config
from kube_edge.client import KubeClient
from kube_edge.errors import ApiError
from tessera_testbed.apiserver import (
    ApiPath,
    ApiProblemError,
    FakeApiServer,
    merge_patch,
    parse_path,
)
from tests.e2e.pki import Authority

GROUP, VERSION, PLURAL = "tessera.dev", "v1alpha1", "nodedevices"
BASE = f"/apis/{GROUP}/{VERSION}"


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as s:
        yield s


@pytest.fixture
def custom(server: FakeApiServer) -> client.CustomObjectsApi:
    configuration = client.Configuration()
    configuration.host = server.url
    return client.CustomObjectsApi(client.ApiClient(configuration))


def _devices(name: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "NodeDevices",
        "metadata": {"name": name},
        "spec": {"gpus": gpus},
    }


def _obj(answer: object) -> dict[str, Any]:
    """The client types custom-object answers as `object`; they are JSON objects."""
    assert isinstance(answer, dict), answer
    return answer


def test_create_get_replace_conflict(custom: client.CustomObjectsApi) -> None:
    created = _obj(custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1)))
    assert created["metadata"]["uid"] and created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1))
    assert err.value.status == 409
    stale = dict(created)
    created["spec"] = {"gpus": 2}
    replaced = _obj(custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", created))
    assert replaced["spec"] == {"gpus": 2}
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    stale["spec"] = {"gpus": 3}
    with pytest.raises(ApiException) as err:
        custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", stale)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "nope")
    assert err.value.status == 404


def test_status_subresource(custom: client.CustomObjectsApi) -> None:
    obj = _obj(custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1)))
    obj["status"] = {"used": 1}
    obj["spec"] = {"gpus": 99}  # ignored on the status subresource
    custom.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, "n", obj)
    obj = _obj(custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n"))
    assert (obj["spec"], obj["status"]) == ({"gpus": 1}, {"used": 1})
    obj["spec"] = {"gpus": 5}
    obj["status"] = {"used": 999}  # ignored on the main resource
    obj = _obj(custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", obj))
    assert (obj["spec"], obj["status"]) == ({"gpus": 5}, {"used": 1})


def test_generation_counts_spec_changes_only(custom: client.CustomObjectsApi) -> None:
    obj = _obj(custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1)))
    assert obj["metadata"]["generation"] == 1
    obj["status"] = {"used": 1}
    obj = _obj(custom.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, "n", obj))
    assert obj["metadata"]["generation"] == 1
    obj["metadata"]["labels"] = {"a": "b"}
    obj["metadata"]["generation"] = 40  # a client cannot set it
    obj = _obj(custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", obj))
    assert obj["metadata"]["generation"] == 1
    obj["spec"] = {"gpus": 2}
    obj = _obj(custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", obj))
    assert obj["metadata"]["generation"] == 2


def test_a_delete_body_is_read_and_the_connection_goes_on(server: FakeApiServer) -> None:
    import http.client
    import json
    from urllib.parse import urlsplit

    server.create("nodes", {"metadata": {"name": "n"}})
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname or "", url.port)
    options = json.dumps(
        {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    )
    conn.request("DELETE", "/api/v1/nodes/n", body=options)
    assert conn.getresponse().read() and server.find("nodes", "n") is None
    conn.request("GET", "/api/v1/nodes")  # the same connection
    reply = conn.getresponse()
    assert reply.status == 200 and json.loads(reply.read())["items"] == []
    conn.close()


def test_patches(server: FakeApiServer) -> None:
    server.create("nodes", {"metadata": {"name": "n", "labels": {"a": "1", "b": "2"}}})
    out = server.patch("nodes", "n", {"metadata": {"labels": {"a": None, "c": "3"}}})
    assert out["metadata"]["labels"] == {"b": "2", "c": "3"}
    out = server.patch(
        "nodes",
        "n",
        [{"op": "replace", "path": "/metadata/labels/b", "value": "9"}],
        kind="json",
    )
    assert out["metadata"]["labels"] == {"b": "9", "c": "3"}
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=server.url)))
    # a list body goes out as application/json-patch+json
    node = core.patch_node("n", [{"op": "add", "path": "/metadata/labels/d", "value": "4"}])
    assert node.metadata is not None and node.metadata.labels == {"b": "9", "c": "3", "d": "4"}
    assert merge_patch({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}


def test_watch_with_the_kubernetes_client(custom: client.CustomObjectsApi) -> None:
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("a", 1))
    listed = _obj(custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))
    assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    since = listed["metadata"]["resourceVersion"]
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("b", 2))
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "a")
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def watcher() -> None:  # from the list's resourceVersion: the changes since, in order
        w = watch.Watch()
        for event in w.stream(
            custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=since,
            timeout_seconds=5,
        ):
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) == 3:
                w.stop()
        done.set()

    thread = threading.Thread(target=watcher, daemon=True)
    thread.start()
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("c", 3))  # live
    assert done.wait(10)
    assert seen == [("ADDED", "b"), ("DELETED", "a"), ("ADDED", "c")]


def test_a_watch_with_a_field_selector_sees_objects_enter_and_leave_it(
    server: FakeApiServer,
) -> None:
    """As the real server sends them: an object that starts matching arrives as ADDED, one
    that stops as DELETED, changes outside the selector not at all; the history replayed
    from a resourceVersion is filtered the same way."""
    since = server.resource_version

    def pod(name: str, node: str = "") -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "c"}]}
        if node:
            spec["nodeName"] = node
        return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}

    server.create("pods", pod("pending"))
    server.create("pods", pod("placed", "n"))
    server.patch("pods", "pending", {"metadata": {"labels": {"a": "b"}}})  # still unbound
    server.bind("default", "pending", {"target": {"name": "n"}})
    server.patch("pods", "pending", {"status": {"phase": "Running"}}, sub="status")
    server.patch("pods", "placed", {"status": {"phase": "Running"}}, sub="status")
    server.delete("pods", "placed", "default")

    def events(selector: str) -> list[tuple[str, str]]:
        client_ = KubeClient(kube_config.for_host(server.url))
        query = {"watch": "true", "resourceVersion": str(since), "timeoutSeconds": 1}
        if selector:
            query["fieldSelector"] = selector
        seen = []
        for line in client_.stream("/api/v1/pods", query, read_timeout=10):
            event = json.loads(line)
            seen.append((event["type"], event["object"]["metadata"]["name"]))
        return seen

    assert events("spec.nodeName!=") == [
        ("ADDED", "placed"),
        ("ADDED", "pending"),  # the binding: it starts matching
        ("MODIFIED", "pending"),
        ("MODIFIED", "placed"),
        ("DELETED", "placed"),
    ]
    assert events("status.phase!=Running") == [
        ("ADDED", "pending"),
        ("ADDED", "placed"),
        ("MODIFIED", "pending"),
        ("MODIFIED", "pending"),
        ("DELETED", "pending"),  # Running: it stops matching
        ("DELETED", "placed"),
    ]
    assert len(events("")) == 7


def test_injected_failures_and_the_write_log(
    custom: client.CustomObjectsApi, server: FakeApiServer
) -> None:
    server.fail(BASE, method="POST", status=503)
    with pytest.raises(ApiException) as err:
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1))
    assert err.value.status == 503
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1))
    obj = _obj(custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n"))
    custom.replace_cluster_custom_object_status(GROUP, VERSION, PLURAL, "n", obj)
    custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "n")
    collection, item = f"{BASE}/{PLURAL}", f"{BASE}/{PLURAL}/n"
    assert server.writes("POST") == [("POST", collection)] * 2
    assert server.writes() == [
        ("POST", collection),
        ("POST", collection),
        ("PUT", f"{item}/status"),
        ("DELETE", item),
    ]  # no GET: only writes
    assert server.writes("put", item) == [("PUT", f"{item}/status")]  # a path prefix
    assert server.writes(path="/api/v1") == []


def test_find_answers_none_where_get_raises(server: FakeApiServer) -> None:
    assert server.find("leases", "l", "ns") is None
    with pytest.raises(ApiProblemError) as err:
        server.get("leases", "l", "ns")
    assert err.value.code == 404
    server.create("leases", {"metadata": {"name": "l", "namespace": "ns"}, "spec": {}})
    found = server.find("leases", "l", "ns")
    assert found == server.get("leases", "l", "ns")
    assert found is not None
    found["spec"]["holderIdentity"] = "x"  # a copy: the store is untouched
    assert server.get("leases", "l", "ns")["spec"] == {}
    assert server.find("leases", "l", "other") is None
    assert server.find("pods", "p") is None  # namespaced, "default" when not given


@pytest.mark.parametrize(
    ("path", "parsed", "group"),
    [
        ("/api/v1/nodes", ApiPath("/api/v1", None, "nodes", None, None), ""),
        ("/api/v1/nodes/n", ApiPath("/api/v1", None, "nodes", "n", None), ""),
        (
            "/api/v1/namespaces/ns/pods/p/binding",
            ApiPath("/api/v1", "ns", "pods", "p", "binding"),
            "",
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
            ApiPath("/apis/coordination.k8s.io/v1", "ns", "leases", None, None),
            "coordination.k8s.io",
        ),
        (
            "/apis/tessera.dev/v1alpha1/nodedevices/n/status?timeout=5s",
            ApiPath("/apis/tessera.dev/v1alpha1", None, "nodedevices", "n", "status"),
            "tessera.dev",
        ),
        (  # not served here, but still a path to take apart
            "/api/v1/namespaces/ns/configmaps/c",
            ApiPath("/api/v1", "ns", "configmaps", "c", None),
            "",
        ),
    ],
)
def test_parse_path(path: str, parsed: ApiPath, group: str) -> None:
    assert parse_path(path) == parsed
    assert parse_path(path).group == group


@pytest.mark.parametrize("path", ["/", "/healthz", "/api/v2/nodes", "/apis/g/v1/a/b/c/d"])
def test_parse_path_refuses_what_is_not_an_api_path(path: str) -> None:
    with pytest.raises(ApiProblemError) as err:
        parse_path(path)
    assert err.value.code == 404


def test_the_before_hook_plays_a_concurrent_writer(
    custom: client.CustomObjectsApi, server: FakeApiServer
) -> None:
    obj = _obj(custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, _devices("n", 1)))
    calls: list[tuple[str, str]] = []

    def other_writer(method: str, path: str) -> None:
        calls.append((method, path))
        if method == "PUT":  # between our read and our write, someone writes status
            current = server.get(PLURAL, "n")
            current["status"] = {"used": len(calls)}
            server.update(PLURAL, current, "status")

    server.before = other_writer
    obj["spec"] = {"gpus": 2}
    with pytest.raises(ApiException) as err:  # a real conflict: our resourceVersion is stale
        custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", obj)
    assert err.value.status == 409
    assert calls == [("PUT", f"{BASE}/{PLURAL}/n")]
    server.before = None
    fresh = _obj(custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, "n"))
    assert (fresh["spec"], fresh["status"]) == ({"gpus": 1}, {"used": 1})
    fresh["spec"] = {"gpus": 2}
    assert _obj(custom.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "n", fresh))[
        "spec"
    ] == {"gpus": 2}


def test_https_with_a_server_context(tmp_path: Path) -> None:
    """What the node agent benchmark uses to run the agent with in-cluster auth."""
    ca = Authority(tmp_path, "cluster")
    pair = ca.issue("apiserver", "kubernetes", server=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pair.cert, pair.key)
    with FakeApiServer(tls=tls) as fake:
        fake.create("nodes", {"metadata": {"name": "n1"}})
        assert fake.url.startswith("https://127.0.0.1:")
        api = KubeClient(kube_config.for_host(fake.url, ca_file=str(ca.path)), timeout=10)
        try:
            assert api.get("/api/v1/nodes/n1")["metadata"]["name"] == "n1"
        finally:
            api.close()
        plain = KubeClient(kube_config.for_host(fake.url), timeout=10)  # no CA: refused
        with pytest.raises(ApiError):
            plain.get("/api/v1/nodes/n1")
        plain.close()
