"""GetPreferredAllocation by the allocation record, as the kubelet calls it: the agent's real
gRPC servers on unix sockets, the simulated kubelet calling them, an API server holding the
pods and their records, and a pod-resources server playing the kubelet's bookkeeping."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.agent import Agent
from deviceplugin.metrics import agent_registry
from deviceplugin.record_pods import RecordChooser, _limits
from deviceplugin.units import device_of
from kube_edge.client import KubeClient
from tessera import resources as rn
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera_edge.keyfiles import KeyringSource
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.kubelet import KubeletSimulator
from tessera_testbed.podresources import PodResourcesServer
from tests.deviceplugin.helpers import make_agent, running

NODE = "node-a"
T0, T1, T2 = "2026-11-26T19:00:00Z", "2026-11-26T19:00:05Z", "2026-11-26T19:00:09Z"


@dataclass
class Node:
    agent: Agent
    kubelet: KubeletSimulator
    api: FakeApiServer
    pod_resources: PodResourcesServer
    ring: Keyring
    chooser: RecordChooser

    def uuid(self, index: int) -> str:
        return self.agent.inventory.gpus[index].uuid

    def all_units(self, resource: str) -> list[str]:
        return [u.id for u in self.agent.units[resource].units]

    def pod(
        self,
        name: str,
        created: str,
        containers: list[tuple[str, dict[str, int], list[int]]],
        *,
        node: str = NODE,
        record_node: str | None = None,
        ring: Keyring | None = None,
        signed: bool = True,
        init: list[tuple[str, dict[str, int], list[int]]] | None = None,
    ) -> dict[str, Any]:
        """A pod bound to `node` whose record gives each container (name, limits, GPU
        indices) those GPUs; signed with the scheduler's key unless told otherwise."""
        uid = f"uid-{name}"
        init = init or []
        entries = [
            ContainerAllocation(
                c,
                tuple(GpuGrant(self.uuid(i), i, i, 100, 1024) for i in gpus),
                init=is_init,
            )
            for is_init, group in ((True, init), (False, containers))
            for c, _, gpus in group
        ]
        record = PodAllocation(uid, "default", name, record_node or node, tuple(entries))
        text = encode(record, (ring or self.ring) if signed else None)
        obj = {
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": uid,
                "creationTimestamp": created,
                "annotations": {rn.ALLOCATION_ANNOTATION: text},
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": c, "resources": {"limits": {k: str(v) for k, v in lim.items()}}}
                    for c, lim, _ in containers
                ],
                "initContainers": [
                    {"name": c, "resources": {"limits": {k: str(v) for k, v in lim.items()}}}
                    for c, lim, _ in init
                ],
            },
        }
        return self.api.create("pods", obj)

    def admit(
        self,
        pod: str,
        container: str,
        resource: str,
        size: int,
        listed: bool = True,
        reuse: str = "",
    ) -> list[str]:
        """What the kubelet does per container and resource: take the units of the init
        container `reuse` first (must-include), offer them with every free unit, take the
        plugin's answer, Allocate it, and remember it (pod-resources List shows it, but not
        for an ordinary init container: `listed` False)."""
        must = self.held.get(pod, {}).get(reuse, {}).get(resource, [])[:size]
        held = {
            u
            for containers in self.held.values()
            for devices in containers.values()
            for u in devices.get(resource, [])
        }
        free = [u for u in self.all_units(resource) if u not in held]
        chosen = self.kubelet.get_preferred_allocation(resource, free + must, must, size)
        self.kubelet.allocate(resource, chosen)
        if listed:
            self.pod_resources.assign("default", pod, container, resource, chosen)
        self.held.setdefault(pod, {}).setdefault(container, {})[resource] = chosen
        return chosen

    held: dict[str, dict[str, dict[str, list[str]]]]


@pytest.fixture
def node(sock_dir: Path) -> Iterator[Node]:
    ring = Keyring.generate()
    agent, _ = make_agent(sock_dir)
    with (
        FakeApiServer() as api,
        PodResourcesServer(sock_dir / "pod-resources.sock") as pod_resources,
        KubeletSimulator(sock_dir) as kubelet,
    ):
        chooser = RecordChooser(
            KubeClient.for_host(api.url),
            NODE,
            KeyringSource.fixed(ring.verifier()),
            lambda: agent.inventory,
            pod_resources.socket_path,
        )
        agent.chooser = chooser
        with running(agent):
            kubelet.wait_registered([rn.GPU_CORE, rn.GPU, rn.GPU_MEMORY])
            yield Node(agent, kubelet, api, pod_resources, ring, chooser, held={})


def _gpus(ids: list[str]) -> Counter[str]:
    return Counter(device_of(u) for u in ids)


def test_a_fractional_pod_gets_units_on_its_record_gpu(node: Node) -> None:
    node.pod("frac", T0, [("main", {rn.GPU_CORE: 30, rn.GPU_MEMORY: 10}, [5])])
    core = node.admit("frac", "main", rn.GPU_CORE, 30)
    memory = node.admit("frac", "main", rn.GPU_MEMORY, 10)
    # the default choice would take GPU 0 (best fit, first listed); the record says GPU 5
    assert _gpus(core) == {node.uuid(5): 30}
    assert _gpus(memory) == {node.uuid(5): 10}
    assert node.chooser.chosen == 2 and node.chooser.fallbacks == 0


def test_a_multi_gpu_pod_gets_every_unit_of_its_record_gpus(node: Node) -> None:
    node.pod("multi", T0, [("main", {rn.GPU: 200}, [3, 6])])
    chosen = node.admit("multi", "main", rn.GPU, 200)
    assert _gpus(chosen) == {node.uuid(3): 100, node.uuid(6): 100}


def test_pods_and_containers_are_followed_in_the_kubelets_order(node: Node) -> None:
    node.pod(
        "two",
        T1,
        [("a", {rn.GPU: 50}, [2]), ("b", {rn.GPU: 100}, [4])],
        init=[("setup", {rn.GPU: 20}, [7])],
    )
    node.pod("older", T0, [("main", {rn.GPU: 25}, [1])])
    # the older pod first (one batch of pods is admitted oldest first), then the other's
    # init container, then its app containers in order
    assert _gpus(node.admit("older", "main", rn.GPU, 25)) == {node.uuid(1): 25}
    assert _gpus(node.admit("two", "setup", rn.GPU, 20, listed=False)) == {node.uuid(7): 20}
    assert _gpus(node.admit("two", "a", rn.GPU, 50)) == {node.uuid(2): 50}
    assert _gpus(node.admit("two", "b", rn.GPU, 100)) == {node.uuid(4): 100}
    # a pod admitted later shares GPU 2 with "two"/a: units that are still free there
    node.pod("later", T2, [("main", {rn.GPU: 50}, [2])])
    later = node.admit("later", "main", rn.GPU, 50)
    assert _gpus(later) == {node.uuid(2): 50}
    assert not set(later) & set(node.held["two"]["a"][rn.GPU])


def test_a_forged_record_cannot_steer_units(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    # older pods whose records are unsigned, signed by another key, or copied from another
    # node, all asking for the same count: none of them is followed
    node.pod("unsigned", "2026-11-26T18:00:00Z", [("main", {rn.GPU: 40}, [7])], signed=False)
    node.pod(
        "other-key", "2026-11-26T18:00:01Z", [("main", {rn.GPU: 40}, [7])], ring=Keyring.generate()
    )
    node.pod("copied", "2026-11-26T18:00:02Z", [("main", {rn.GPU: 40}, [7])], record_node="node-b")
    node.pod("honest", T0, [("main", {rn.GPU: 40}, [6])])
    assert _gpus(node.admit("honest", "main", rn.GPU, 40)) == {node.uuid(6): 40}
    # with only the forged ones left, the default choice (GPU 0, best fit) is taken
    with caplog.at_level(logging.INFO, logger="deviceplugin.record_pods"):
        chosen = node.admit("unsigned", "main", rn.GPU, 40)
    assert node.uuid(7) not in _gpus(chosen)
    assert "preferred allocation by default" in caplog.text


def test_the_answers_are_counted_in_the_agents_metrics(node: Node) -> None:
    node.pod("frac", T0, [("main", {rn.GPU: 30}, [5])])
    node.admit("frac", "main", rn.GPU, 30)
    node.admit("nobody", "main", rn.GPU, 45)
    registry = agent_registry(node.agent)
    name = "tessera_device_plugin_preferred_allocations_total"
    assert registry.get_sample_value(name, {"node": NODE, "answer": "record"}) == 1
    assert registry.get_sample_value(name, {"node": NODE, "answer": "default"}) == 1


def test_without_a_pod_that_fits_the_default_choice_is_taken(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.pod("frac", T0, [("main", {rn.GPU_CORE: 30, rn.GPU_MEMORY: 10}, [5])])
    with caplog.at_level(logging.INFO, logger="deviceplugin.record_pods"):
        chosen = node.admit("someone-else", "main", rn.GPU_CORE, 45)  # no record asks 45
    assert _gpus(chosen) == {node.uuid(0): 45}
    assert "no pending pod's record needs 45 units" in caplog.text
    assert node.chooser.fallbacks == 1


def test_pods_created_together_on_different_gpus_fall_back(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.pod("a", T0, [("main", {rn.GPU: 30}, [2])])
    node.pod("b", T0, [("main", {rn.GPU: 30}, [3])])
    with caplog.at_level(logging.INFO, logger="deviceplugin.record_pods"):
        chosen = node.admit("a", "main", rn.GPU, 30)
    assert _gpus(chosen) == {node.uuid(0): 30}
    assert "created together" in caplog.text


def test_an_unreachable_api_server_or_kubelet_falls_back(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.pod("frac", T0, [("main", {rn.GPU: 30}, [5])])
    node.pod_resources.stop()
    with caplog.at_level(logging.INFO, logger="deviceplugin.record_pods"):
        chosen = node.admit("frac", "main", rn.GPU, 30)
    assert _gpus(chosen) == {node.uuid(0): 30}
    assert "pod-resources List" in caplog.text
    node.api.stop()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="deviceplugin.record_pods"):
        node.admit("frac", "main", rn.GPU_CORE, 30)
    assert "cannot list this node's pods" in caplog.text


def test_finished_and_deleted_pods_are_not_waiting(node: Node) -> None:
    done = node.pod("done", "2026-11-26T18:00:00Z", [("main", {rn.GPU: 30}, [7])])
    node.api.patch("pods", "done", {"status": {"phase": "Succeeded"}}, "default", "status")
    assert done["metadata"]["uid"] == "uid-done"
    node.pod("frac", T0, [("main", {rn.GPU: 30}, [5])])
    assert _gpus(node.admit("frac", "main", rn.GPU, 30)) == {node.uuid(5): 30}


def test_pods_of_other_nodes_are_not_waiting_here(node: Node) -> None:
    node.pod("elsewhere", "2026-11-26T18:00:00Z", [("main", {rn.GPU: 30}, [7])], node="node-b")
    node.pod("frac", T0, [("main", {rn.GPU: 30}, [5])])
    assert _gpus(node.admit("frac", "main", rn.GPU, 30)) == {node.uuid(5): 30}
    assert node.chooser.chosen == 1


def test_without_record_keys_the_agent_does_not_follow_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from deviceplugin.cli import _record_chooser, _record_keys, build_parser
    from deviceplugin.config import DevicePluginConfig
    from tessera_cli import config_from

    def config(keys: Path) -> DevicePluginConfig:
        args = build_parser().parse_args([f"--integrity-key-file={keys}", f"--node-name={NODE}"])
        return config_from(DevicePluginConfig, args)

    agent, _ = make_agent(tmp_path)
    with FakeApiServer() as api:
        client = KubeClient.for_host(api.url)
        missing = config(tmp_path / "none")
        with caplog.at_level(logging.WARNING, logger="deviceplugin.cli"):
            assert _record_keys(missing) is None
        assert "does not follow allocation records" in caplog.text
        keys = tmp_path / "keys"
        keys.mkdir()
        ring = Keyring.generate("k1")
        public = ring.public_key("k1")
        assert public is not None
        (keys / "k1.pem").write_bytes(
            public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        present = config(keys)
        found = _record_keys(present)
        assert found is not None
        assert isinstance(_record_chooser(present, client, agent, found), RecordChooser)


def test_a_pod_the_kubelet_already_runs_is_not_waiting(node: Node) -> None:
    # only its init container asked for GPU units, and the kubelet's List never shows
    # ordinary init containers; but the pod has container statuses: it was admitted already
    node.pod(
        "running",
        "2026-11-26T18:00:00Z",
        [("main", {}, [])],
        init=[("setup", {rn.GPU: 30}, [7])],
    )
    statuses = {
        "initContainerStatuses": [{"name": "setup"}],
        "containerStatuses": [{"name": "main"}],
    }
    node.api.patch("pods", "running", {"status": statuses}, "default", "status")
    node.pod("frac", T0, [("main", {rn.GPU: 30}, [5])])
    assert _gpus(node.admit("frac", "main", rn.GPU, 30)) == {node.uuid(5): 30}


def test_an_app_container_reusing_its_init_containers_units_completes_them(node: Node) -> None:
    # the kubelet hands an app container its init container's units first (must-include)
    # and asks for the rest; the record puts both on GPU 2
    node.pod("reuse", T0, [("app", {rn.GPU: 50}, [2])], init=[("setup", {rn.GPU: 20}, [2])])
    setup = node.admit("reuse", "setup", rn.GPU, 20, listed=False)
    app = node.admit("reuse", "app", rn.GPU, 50, reuse="setup")
    assert _gpus(setup) == {node.uuid(2): 20}
    assert set(setup) <= set(app) and _gpus(app) == {node.uuid(2): 50}
    assert node.chooser.chosen == 2


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


_CONTAINER = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=6) | _JSON,
        "resources": st.fixed_dictionaries(
            {}, optional={"limits": st.dictionaries(st.just(rn.GPU), _JSON) | _JSON}
        )
        | _JSON,
    },
)


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "spec": st.fixed_dictionaries(
                {},
                optional={
                    "containers": st.lists(_CONTAINER, max_size=3) | _JSON,
                    "initContainers": st.lists(_CONTAINER, max_size=2) | _JSON,
                },
            )
            | _JSON
        },
    )
)
def test_any_pod_shape_gives_limits_or_none(pod: dict[str, Any]) -> None:
    """A pod is the API server's, but its spec came from anyone: no shape makes the limits
    reader raise, and what it returns is positive counts of named containers."""
    got = _limits(pod, rn.GPU)
    assert got is None or all(isinstance(c, str) and n > 0 for c, n in got)


def test_limits_follow_the_kubelets_order_and_skip_other_containers() -> None:
    def c(name: str, value: object) -> dict[str, Any]:
        return {"name": name, "resources": {"limits": {rn.GPU: value}}}

    pod = {
        "spec": {
            "containers": [c("a", "50"), {"name": "plain"}, c("b", 100)],
            "initContainers": [c("setup", "0"), c("warm", "20")],
        }
    }
    assert _limits(pod, rn.GPU) == (("warm", 20), ("a", 50), ("b", 100))
    assert _limits(pod, rn.GPU_CORE) == ()
    assert _limits({"spec": {"containers": [c("a", "1.5")]}}, rn.GPU) is None
