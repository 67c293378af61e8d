"""The node agent says what enforces GPU shares on its node: it probes the layer named by
--isolation at start and on every health query, publishes it in its NodeDevices object
(spec.isolation) and the tessera.dev/isolation label, and exports it as metrics; a layer
that goes down or comes back is published again. Also `tessera_device_plugin_registered`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from deviceplugin.cli import main
from deviceplugin.inventory import InventoryConfig, InventoryPublisher, node_labels
from deviceplugin.metrics import agent_registry
from kube_edge.client import KubeClient
from tessera.isolation import LAYER_HAMI_CORE, LAYER_MPS, UNKNOWN_VERSION, NodeIsolation
from tessera.model import NodeInventory
from tessera.resources import GPU, GPU_CORE, GPU_MEMORY, GPU_MEMORY_RATIO, ISOLATION_LABEL
from tessera_cli.metrics import serve_metrics
from tessera_edge.hami_core import install, load_source, node_arch, record_error
from tessera_edge.layer_probe import LayerPaths, LayerProbe
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.kubelet import KubeletSimulator
from tests.deviceplugin.helpers import make_agent, running
from tests.deviceplugin.test_metrics import _free_port, _scrape
from tests.edge.layer_files import elf_library, image_folder, other_arch
from tests.waiting import wait_until

T = TypeVar("T")
NODE = "node-a"
LIBRARY = "/usr/local/vgpu/libvgpu.so"
ARCH = node_arch()


@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.create(
            "nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {}}},
        )
        yield server


def _host_with_library(tmp_path: Path, version: str = "v1") -> Path:
    host = tmp_path / "host"
    source = load_source(str(image_folder(tmp_path / f"image-{version}", ARCH, version)[0]), ARCH)
    install(source, str(host) + LIBRARY)
    return host


def _probe(host: Path, layer: str = LAYER_HAMI_CORE, proc: Path | None = None) -> LayerProbe:
    return LayerProbe(
        LayerPaths(layer, LIBRARY, "/tmp/nvidia-mps", str(host), str(proc or "/proc"))
    )


def _spec(server: FakeApiServer) -> dict[str, Any]:
    obj = server.find("nodedevices", NODE)
    assert obj is not None
    spec: dict[str, Any] = obj["spec"]
    return spec


def _spec_isolation(server: FakeApiServer) -> Any:
    obj = server.find("nodedevices", NODE)
    return None if obj is None else obj["spec"].get("isolation")


def test_the_agent_publishes_its_layer_and_follows_it(
    apiserver: FakeApiServer, tmp_path: Path
) -> None:
    host = _host_with_library(tmp_path)
    agent, _ = make_agent(tmp_path / "dp", "t4-4x", query_interval_s=0.05)
    agent.layer = _probe(host)
    agent.publisher = InventoryPublisher(
        KubeClient.for_host(apiserver.url, timeout=5), InventoryConfig(NODE)
    )
    lib = host / LIBRARY.lstrip("/")
    with running(agent):
        up = wait_until(lambda: _spec_isolation(apiserver))
        assert up == {
            "layer": "hami-core",
            "up": True,
            "version": "8f3a89c+tessera.v1",
            "commit": "8f3a89c" + "0" * 33,
            "reason": "",
        }
        labels = apiserver.get("nodes", NODE)["metadata"]["labels"]
        assert labels[ISOLATION_LABEL] == "hami-core"
        # the scheduler reads it back through the core's one parser
        parsed = NodeInventory.from_dict(_spec(apiserver), source="nodedevices/node-a")
        assert parsed.isolation == NodeIsolation(
            "hami-core", True, "8f3a89c+tessera.v1", "8f3a89c" + "0" * 33
        )
        # the file is truncated under the node (a full disk while copying by hand)
        lib.write_bytes(lib.read_bytes()[:4096])

        def went_down() -> dict[str, Any] | None:
            found = _spec_isolation(apiserver)
            return found if found and not found["up"] else None

        down = wait_until(went_down)
        assert down is not None
        assert "does not match its stamp (truncated or replaced; 4096 bytes)" in down["reason"]
        layer = NodeInventory.from_dict(_spec(apiserver), source="x").isolation
        assert layer is not None and not layer.takes_shares
        assert str(layer.refusal()).startswith("isolation layer hami-core is down: ")
        # installed again: up again, published again
        install(load_source(str(tmp_path / "image-v1"), ARCH), str(lib))
        wait_until(lambda: (i := _spec_isolation(apiserver)) and i["up"])
    assert agent.inventory_error == ""


def test_a_failed_install_keeps_the_layer_down_with_its_reason(tmp_path: Path) -> None:
    host = _host_with_library(tmp_path)
    lib = str(host) + LIBRARY
    record_error(lib, "HAMi-core not installed at /usr/local/vgpu/libvgpu.so: sha256 differs")
    found = _probe(host).probe()
    assert not found.up and found.version == "8f3a89c+tessera.v1"
    assert found.reason == (
        "the last install failed: HAMi-core not installed at /usr/local/vgpu/libvgpu.so: "
        "sha256 differs"
    )
    # on a fresh node (no library at all) the installer's reason wins too
    fresh = tmp_path / "fresh"
    record_error(str(fresh) + LIBRARY, "HAMi-core not installed: built for aarch64")
    assert _probe(fresh).probe().reason == (
        "the last install failed: HAMi-core not installed: built for aarch64"
    )


def test_the_operators_own_library_is_up_with_an_unknown_version(tmp_path: Path) -> None:
    host = tmp_path / "host"
    lib = host / LIBRARY.lstrip("/")
    lib.parent.mkdir(parents=True)
    probe = _probe(host)
    assert probe.probe() == NodeIsolation(
        "hami-core", False, reason="the HAMi-core library /usr/local/vgpu/libvgpu.so is missing"
    )
    lib.write_bytes(elf_library(ARCH, b"mine"))
    assert probe.probe() == NodeIsolation("hami-core", True, UNKNOWN_VERSION)
    lib.write_bytes(elf_library(other_arch(), b"mine"))
    assert f"not this node's {ARCH}" in probe.probe().reason
    lib.write_bytes(b"")
    assert "not an ELF file" in probe.probe().reason


def test_the_library_is_hashed_again_only_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = _host_with_library(tmp_path)
    probe = _probe(host)
    hashed: list[str] = []
    from tessera_edge import hami_core, layer_probe

    def counted(path: str) -> str:
        hashed.append(path)
        return hami_core.file_sha256(path)

    monkeypatch.setattr(layer_probe, "file_sha256", counted)
    for _ in range(5):
        assert probe.probe().up
    assert len(hashed) == 1
    install(
        load_source(str(image_folder(tmp_path / "v2", ARCH, "v2")[0]), ARCH), str(host) + LIBRARY
    )
    assert probe.probe().version == "8f3a89c+tessera.v2"
    assert len(hashed) == 2


def _proc_entry(proc: Path, pid: int, comm: str, state: str = "S") -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560")


def test_the_mps_layer_follows_the_daemon_in_the_hosts_proc(tmp_path: Path) -> None:
    host, proc = tmp_path / "host", tmp_path / "proc"
    pipe = host / "tmp/nvidia-mps"
    pipe.mkdir(parents=True)
    probe = _probe(host, LAYER_MPS, proc)
    assert probe.probe().reason == (
        "the MPS control daemon is not running (no /tmp/nvidia-mps/nvidia-cuda-mps-control.pid)"
    )
    (pipe / "nvidia-cuda-mps-control.pid").write_text("4242\n")
    assert "(pid 4242 in /tmp/nvidia-mps/nvidia-cuda-mps-control.pid) is not running" in (
        probe.probe().reason
    )
    _proc_entry(proc, 4242, "nvidia-cuda-mps")
    assert probe.probe() == NodeIsolation("mps", True)
    _proc_entry(proc, 4242, "nvidia-cuda-mps", state="Z")  # died, not reaped yet
    assert not probe.probe().up
    _proc_entry(proc, 4242, "bash")  # the pid went to another process
    assert not probe.probe().up
    (pipe / "tessera-mps.error").write_text("nvidia-cuda-mps-control not found: ...\n")
    assert probe.probe().reason == "nvidia-cuda-mps-control not found: ..."


def test_the_label_names_the_layer_and_goes_with_it() -> None:
    inventory = NodeInventory(NODE, isolation=NodeIsolation("mps", False, reason="x"))
    assert node_labels(inventory)[ISOLATION_LABEL] == "mps"
    assert node_labels(NodeInventory(NODE))[ISOLATION_LABEL] is None  # not reported: removed


def test_metrics_say_whether_the_layer_is_up_and_the_agent_registered(
    tmp_path: Path, sock_dir: Path
) -> None:
    host = _host_with_library(tmp_path)
    agent, _ = make_agent(sock_dir, "t4-4x")
    agent.layer = _probe(host)
    port = _free_port()
    registered = ("tessera_device_plugin_registered", (("node", NODE),))
    up = ("tessera_node_isolation_layer_up", (("layer", "hami-core"), ("node", NODE)))
    info = (
        "tessera_node_isolation_layer_info",
        (
            ("commit", "8f3a89c" + "0" * 33),
            ("layer", "hami-core"),
            ("node", NODE),
            ("version", "8f3a89c+tessera.v1"),
        ),
    )
    with running(agent):
        serve_metrics(agent_registry(agent), port, "127.0.0.1")
        before = _scrape(port)
        assert before[registered] == 0  # no kubelet yet
        assert before[up] == 1 and before[info] == 1
        with KubeletSimulator(sock_dir) as kubelet:
            kubelet.wait_registered([GPU_CORE, GPU_MEMORY_RATIO, GPU_MEMORY, GPU])
            assert wait_until(lambda: _scrape(port)[registered] == 1)
            (host / LIBRARY.lstrip("/")).unlink()
            agent.query_once()
            assert _scrape(port)[up] == 0
        # the kubelet went away (its socket with it): not registered any more
        assert wait_until(lambda: _scrape(port)[registered] == 0)


def test_print_inventory_shows_the_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = _host_with_library(tmp_path)
    code = main(
        [
            "--backend=fake",
            "--topology=t4-4x",
            "--print-inventory",
            "--isolation=hami-core",
            f"--host-root={host}",
        ]
    )
    assert code == 0
    spec = json.loads(capsys.readouterr().out)["spec"]
    assert spec["isolation"]["up"] is True and spec["isolation"]["layer"] == "hami-core"
    # without --isolation nothing is reported (an older agent's inventory)
    assert main(["--backend=fake", "--topology=t4-4x", "--print-inventory"]) == 0
    assert "isolation" not in json.loads(capsys.readouterr().out)["spec"]


def test_a_probe_that_raises_is_the_layer_down(tmp_path: Path) -> None:
    agent, _ = make_agent(tmp_path, "t4-4x")
    probe = _probe(tmp_path / "host")

    def broken() -> NodeIsolation:
        raise PermissionError(13, "Permission denied")

    probe.probe = broken  # type: ignore[method-assign]
    agent.layer = probe
    inventory = agent.discover()
    assert inventory.isolation == NodeIsolation(
        "hami-core", False, reason="the probe failed: PermissionError"
    )
