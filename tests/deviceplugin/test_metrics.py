"""The node agent's Prometheus metrics: scraped over HTTP from a running agent, they follow
its devices, their health and what it advertises to the kubelet."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin.backend import XidEvent
from deviceplugin.cli import main
from deviceplugin.metrics import agent_registry
from tessera.resources import GPU, GPU_CORE
from tessera_cli.metrics import serve_metrics
from tests.deviceplugin.helpers import make_agent, running

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_scraped_metrics_follow_devices_health_and_units(tmp_path: Path) -> None:
    agent, backend = make_agent(tmp_path)
    port = _free_port()
    with running(agent):
        serve_metrics(agent_registry(agent), port, "127.0.0.1")
        before = _scrape(port)
        gpu3 = backend.gpu(3)
        ident = {"node": "node-a", "gpu": "3", "uuid": gpu3.uuid}
        assert _value(before, "tessera_node_gpu_healthy", **ident) == 1
        assert _value(before, "tessera_node_gpu_memory_bytes", **ident) == gpu3.memory_mib << 20
        info = {**ident, "model": gpu3.model, "minor": str(gpu3.minor)}
        assert _value(before, "tessera_node_gpu_info", **info, pci_bus_id=gpu3.pci_bus_id) == 1
        whole = {"node": "node-a", "resource": GPU}
        advertised = len(agent.units[GPU].units)
        assert (
            _value(before, "tessera_device_plugin_units", **whole, health="healthy") == advertised
        )
        assert _value(before, "tessera_device_plugin_units", **whole, health="unhealthy") == 0

        agent.apply_events([XidEvent(gpu3.uuid, 79, "XID 79")])
        after = _scrape(port)
        assert _value(after, "tessera_node_gpu_healthy", **ident) == 0
        healthy_after = advertised * 7 // 8
        assert (
            _value(after, "tessera_device_plugin_units", **whole, health="healthy") == healthy_after
        )
        core = {"node": "node-a", "resource": GPU_CORE}
        per_gpu = len(agent.units[GPU_CORE].units) // 8
        assert _value(after, "tessera_device_plugin_units", **core, health="unhealthy") == per_gpu
        assert _value(after, "tessera_device_plugin_discovery_errors", node="node-a") == 0
        rdma = [k for k in after if k[0] == "tessera_node_rdma_device_healthy"]
        assert len(rdma) == len(agent.inventory.nics) and all(after[k] == 1 for k in rdma)


def test_a_metrics_port_in_use_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, busy_port: int
) -> None:
    port = busy_port
    status = main(
        [
            "--backend=fake",
            "--topology=t4-4x",
            "--no-inventory",
            f"--device-plugin-dir={tmp_path}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={port}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    # discovery has logged what it found; the failure is one line naming the flag
    assert "--metrics-port" in err[-1] and str(port) in err[-1]
    assert not any("Traceback" in line for line in err)
