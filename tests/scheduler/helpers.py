"""Builders shared by the scheduler tests: inventories, pods, a running service, and
`Served`, the harness of a test that drives that service as kube-scheduler does."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube_edge.client import KubeClient
from kube_edge.informer import Informer
from scheduler_plugin.decisions.binder import BindArgs
from scheduler_plugin.service import Options, Service
from scheduler_plugin.state.cache import Cache
from tessera import resources as rn
from tessera.record import Keyring
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.browser import wait_for as wait_for  # noqa: PLC0414 - re-exported
from tessera_testbed.inventory import heartbeat_lease, nodedevices
from tests.vectors import EXTENDER

KEYRING = Keyring.generate("k1")
ROOT = Path(__file__).resolve().parents[2]
VECTORS = EXTENDER


def heartbeat(node: str, offset: float = 0.0, duration: int = 40) -> dict[str, Any]:
    """`node`'s heartbeat Lease, renewed `offset` seconds from now."""
    return heartbeat_lease(node, time.time() + offset, duration)


def pod(
    name: str,
    resources: Mapping[str, Any] | None = None,
    *,
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    priority: int = 0,
) -> dict[str, Any]:
    res = {k: str(v) for k, v in (resources or {}).items()}
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": res, "requests": res}}
            ],
            "priority": priority,
        },
        "status": {"phase": "Pending"},
    }
    if uid:
        obj["metadata"]["uid"] = uid
    return obj


def gang_member(name: str, gang: str, gpus: int, *, namespace: str = "ml") -> dict[str, Any]:
    """A pod of `gpus` whole GPUs in the gang (PodGroup) `gang`."""
    obj = pod(name, {rn.GPU: gpus * 100}, namespace=namespace)
    obj["metadata"]["labels"] = {rn.POD_GROUP_LABEL: gang}
    return obj


def pod_group(name: str, min_member: int, *, namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"minMember": min_member}}


def share(core: int, ratio: int) -> dict[str, int]:
    return {rn.GPU_CORE: core, rn.GPU_MEMORY_RATIO: ratio}


def populate(fake: FakeApiServer, nodes: list[str], **kw: Any) -> None:
    for node in nodes:
        fake.create("nodes", {"metadata": {"name": node}})
        fake.create("nodedevices", nodedevices(node, **kw))
        fake.create("leases", heartbeat(node))


def client_for(fake: FakeApiServer, timeout: float = 5.0) -> KubeClient:
    return KubeClient.for_host(fake.url, timeout=timeout)


def options(**kw: Any) -> Options:
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "policy": "binpack",
        "leader_elect": False,
        "status_interval": 0.2,
        "health_port": 0,
        "open_debug": True,
    }
    base.update(kw)
    return Options(**base)


def start(fake: FakeApiServer, tls: ssl.SSLContext | None = None, **kw: Any) -> Service:
    """A started extender on `fake`, signing with KEYRING; `kw` overrides `options`."""
    return Service(options(**kw), client_for(fake), KEYRING, tls=tls).start()


@contextmanager
def running(fake: FakeApiServer, tls: ssl.SSLContext | None = None, **kw: Any) -> Iterator[Service]:
    """`start`, ready, and stopped on leaving the block."""
    service = start(fake, tls, **kw)
    try:
        assert service.wait_ready(10), service.readiness()
        yield service
    finally:
        service.stop()


@contextmanager
def running_nodes(nodes: list[str], gpus: int) -> Iterator[Service]:
    """A fake API server holding `nodes` with `gpus` GPUs each, and `running` on it."""
    with FakeApiServer() as fake:
        populate(fake, nodes, gpus=gpus)
        with running(fake) as service:
            yield service


@contextmanager
def serving(fake: FakeApiServer, tls: ssl.SSLContext | None = None, **kw: Any) -> Iterator[Served]:
    """`running`, with a keep-alive client on its extender port: a `Served`."""
    with running(fake, tls, **kw) as service:
        yield Served.over(fake, service)


@contextmanager
def serving_nodes(fake: FakeApiServer, nodes: list[str], gpus: int) -> Iterator[Served]:
    """`populate` with `gpus` GPUs a node, then `serving`: the usual start of a test."""
    populate(fake, nodes, gpus=gpus)
    with serving(fake) as served:
        yield served


class Http:
    """A keep-alive HTTP client for one server, like kube-scheduler's."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=30)
        # tests often use a client for one call (`Http(port).get(...)`): its connection
        # closes when the client goes, not whenever the collector finds the socket
        self._closer = weakref.finalize(self, self.conn.close)

    def close(self) -> None:
        self._closer()

    def post_raw(
        self, path: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        hdrs = {"Content-Type": "application/json"} | dict(headers or {})
        self.conn.request("POST", path, body=body, headers=hdrs)
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self.conn.close()
        return resp.status, data

    def post(self, path: str, obj: Any) -> tuple[int, Any]:
        status, data = self.post_raw(path, json.dumps(obj).encode())
        return status, json.loads(data) if data else None

    def get(self, path: str) -> tuple[int, bytes]:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        data = resp.read()
        return resp.status, data


def schedule(http_: Http, fake: FakeApiServer, obj: dict[str, Any], nodes: list[str]) -> str | None:
    """What kube-scheduler does: filter, prioritize, pick the best, bind. Returns the node,
    or None when nothing fits or the bind was refused."""
    created = fake.create("pods", obj) if "resourceVersion" not in obj["metadata"] else obj
    status, result = http_.post("/filter", {"Pod": created, "Nodes": None, "NodeNames": nodes})
    assert status == 200, result
    passed = result["NodeNames"]
    if not passed:
        return None
    if len(passed) > 1:
        status, scores = http_.post(
            "/prioritize", {"Pod": created, "Nodes": None, "NodeNames": passed}
        )
        assert status == 200
        best = max(scores, key=lambda s: (s["Score"], -passed.index(s["Host"])))["Host"]
    else:
        best = passed[0]
    status, bound = http_.post("/bind", bind_body(created, best))
    assert status == 200
    return None if bound["Error"] else best


def bind_body(created: dict[str, Any], node: str) -> dict[str, str]:
    """What kube-scheduler sends to bind `created` (a pod as the API server returned it)
    to `node` (its ExtenderBindingArgs)."""
    meta = created["metadata"]
    return BindArgs(meta["name"], meta["namespace"], meta["uid"], node).to_json()


@dataclass(frozen=True)
class Served:
    """A tessera-scheduler serving `fake`, and `http`, a kube-scheduler's connection to its
    extender port: what a test drives and what it then looks at."""

    fake: FakeApiServer
    service: Service
    http: Http

    @classmethod
    def over(cls, fake: FakeApiServer, service: Service) -> Served:
        """A started `service` on `fake`, with a new connection to it."""
        return cls(fake, service, Http(service.server.port))

    def reconnect(self) -> Served:
        """The same service over a new connection (another kube-scheduler worker's)."""
        return Served.over(self.fake, self.service)

    def schedule(self, obj: dict[str, Any], nodes: list[str]) -> str | None:
        """`schedule` over this connection."""
        return schedule(self.http, self.fake, obj, nodes)

    def bind(self, created: dict[str, Any], node: str) -> str:
        """Bind `created` to `node` as kube-scheduler does; the answer's Error ("" if bound)."""
        status, result = self.http.post("/bind", bind_body(created, node))
        assert status == 200, result
        return str(result["Error"])

    def filter(self, created: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
        """The filter answer for `created` on `nodes`."""
        status, result = self.http.post("/filter", {"Pod": created, "NodeNames": nodes})
        assert status == 200, result
        return dict(result)

    @property
    def cache(self) -> Cache:
        """The service's cache: what it counts as held, and its problems."""
        return self.service.cache

    def informer(self, resource: str) -> Informer:
        """The service's informer of `resource` ("pods", "nodedevices", ...)."""
        return next(i for i in self.service.informers if i.name == resource)

    def wait_settled(self) -> None:
        """Wait until the pod watch has seen every bind (none is only assumed any more)."""
        wait_for(lambda: not self.cache.pods.assumed())

    def node_summary(self, node: str) -> dict[str, Any]:
        """The cache's summary of a node the test has populated (None would be a test bug)."""
        summary = self.cache.node_summary(node)
        assert summary is not None, f"no node {node}"
        return summary

    def used_core(self, node: str, slot: int = 0) -> int:
        """The compute (percent of a GPU) the cache counts as used on GPU `slot` of `node`."""
        return int(self.node_summary(node)["gpus"][slot]["core"]["used"])
