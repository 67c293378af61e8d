"""The kubelet's pod-resources API (v1 PodResourcesLister.List) on a unix socket, for tests.

The real kubelet serves it on `<root dir>/pod-resources/kubelet.sock` and answers List with
every pod it runs and the device IDs each container holds, one `ContainerDevices` entry per
device ID (per NUMA node when the plugin reports topology), as the kubelet's container
manager builds them: a reader must gather a resource's IDs over entries. Here the test plays
the kubelet's bookkeeping: `assign` records the IDs a container got (after the simulated
kubelet's Allocate), `forget` drops a pod. `calls` counts List calls.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from protos.kubelet.podresources.v1 import api_pb2 as prpb
from protos.kubelet.podresources.v1 import api_pb2_grpc as prpb_grpc


class PodResourcesServer(prpb_grpc.PodResourcesListerServicer):
    def __init__(self, socket_path: str | Path) -> None:
        self.socket_path = Path(socket_path)
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self._server: grpc.Server | None = None
        self.calls = 0

    def assign(
        self, namespace: str, pod: str, container: str, resource: str, ids: list[str]
    ) -> None:
        with self._lock:
            containers = self._pods.setdefault((namespace, pod), {})
            containers.setdefault(container, {})[resource] = list(ids)

    def forget(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._pods.pop((namespace, pod), None)

    def List(
        self, request: prpb.ListPodResourcesRequest, context: Any
    ) -> prpb.ListPodResourcesResponse:
        response = prpb.ListPodResourcesResponse()
        with self._lock:
            self.calls += 1
            for (namespace, name), containers in self._pods.items():
                pod = response.pod_resources.add(name=name, namespace=namespace)
                for container, devices in containers.items():
                    entry = pod.containers.add(name=container)
                    for resource, ids in devices.items():
                        for device_id in ids:
                            entry.devices.add(resource_name=resource, device_ids=[device_id])
        return response

    def start(self) -> PodResourcesServer:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prpb_grpc.add_PodResourcesListerServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
