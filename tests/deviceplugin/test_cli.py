from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from deviceplugin.cli import build_parser, main
from tessera.model import NodeInventory
from tessera_edge.logs import setup_logging
from tessera_testbed.kubelet import KubeletSimulator, fake_agent_command

pytestmark = pytest.mark.usefixtures("restore_logging")


def test_every_flag_is_explained() -> None:
    parser = build_parser()
    text = parser.format_help()
    flags = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= 20
    for action in flags:
        assert action.help and len(action.help) > 10, action.option_strings
        assert action.option_strings[0] in text
    for needed in (
        "--backend",
        "--topology",
        "--device-plugin-dir",
        "--node-name",
        "--kubeconfig",
        "--memory-unit-mib",
        "--health-ignore-xids",
        "--health-recovery-seconds",
        "--log-format",
        "--no-inventory",
    ):
        assert needed in text


def test_print_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "--backend",
            "fake",
            "--topology",
            "h100-sxm-8x",
            "--node-name",
            "n1",
            "--print-inventory",
            "--log-level",
            "error",
        ]
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    inventory = NodeInventory.from_dict(report["spec"])
    assert inventory.node_name == "n1" and len(inventory.gpus) == 8
    assert report["units"]["tessera.dev/gpu-memory"] == 8 * 79
    assert report["errors"] == []


def test_a_broken_entry_is_reported_and_the_rest_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {
                        "uuid": "GPU-a",
                        "model": "T4",
                        "memoryMiB": 15360,
                        "pciBusId": "0000:3b:00.0",
                    },
                    {"uuid": "GPU-b", "model": "T4", "memoryMiB": -5, "pciBusId": "0000:3c:00.0"},
                ]
            }
        )
    )
    rc = main(["--backend", "fake", "--topology", str(path), "--print-inventory"])
    captured = capsys.readouterr()
    assert rc == 0
    report = json.loads(captured.out)
    assert [g["uuid"] for g in report["spec"]["gpus"]] == ["GPU-a"]
    assert report["errors"] == [f"{path}: gpus[1].memoryMiB: must be >= 1, got -5"]
    assert "gpus[1].memoryMiB" in captured.err  # logged too


def test_configuration_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "--backend",
            "fake",
            "--topology",
            "h100-sxm-8x",
            "--memory-unit-mib",
            "1",
            "--print-inventory",
        ]
    )
    assert rc == 2
    assert "--memory-unit-mib to at least" in capsys.readouterr().err
    missing = tmp_path / "nope.yaml"
    assert main(["--backend", "fake", "--topology", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err
    assert main(["--backend", "fake"]) == 2
    with pytest.raises(SystemExit):
        main(["--health-ignore-xids", "13,x"])


def test_json_logs() -> None:
    stream = io.StringIO()
    setup_logging("json", "info", stream=stream)
    logging.getLogger("deviceplugin.test").warning("GPU %s is unhealthy", "GPU-1")
    doc = json.loads(stream.getvalue().splitlines()[-1])
    assert doc["level"] == "warning" and doc["msg"] == "GPU GPU-1 is unhealthy"
    assert doc["logger"] == "deviceplugin.test" and doc["time"].endswith("Z")


def test_the_command_serves_the_kubelet_and_stops_on_sigterm(sock_dir: Path) -> None:
    argv, env = fake_agent_command(sock_dir, "t4-4x", "--no-inventory", "--log-format", "json")
    with KubeletSimulator(sock_dir) as kubelet:
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            kubelet.wait_registered(["tessera.dev/gpu-core", "tessera.dev/gpu"], timeout_s=20)
            snapshot = kubelet.endpoint("tessera.dev/gpu").wait_for(lambda m: len(m.devices) > 0)
            assert len(snapshot.devices) == 400
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert any("stopping" in line["msg"] for line in lines)
        assert not list(sock_dir.glob("tessera.dev_*.sock"))  # our sockets are cleaned up
