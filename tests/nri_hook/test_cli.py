"""The command line, and the plugin run the way containerd launches it."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_hook.cli import build_parser, launched_identity, main
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_testbed.containerd import CONTAINERD_2_3, RuntimeSimulator, make_container, make_pod

KEY = b"cli-test-integrity-key-0123456789"


def test_help_explains_every_flag_and_its_default() -> None:
    parser = build_parser()
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 20, action.option_strings
        for option in action.option_strings:
            assert option in text
        if not isinstance(action, argparse._StoreTrueAction):
            assert "default" in action.help, action.option_strings


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """main() configures the root logger; put it back for the tests that follow."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_flags_are_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad_index:
        main(["--plugin-index", "7", "--no-integrity"])
    assert bad_index.value.code == 2
    assert "two digits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--isolation", "vgpu"])
    assert (
        main(
            ["--integrity-key-file", str(tmp_path / "absent"), "--log-file", str(tmp_path / "log")]
        )
        == 2
    )
    assert "does not exist" in (tmp_path / "log").read_text()


def test_launched_identity_reads_the_runtime_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NRI_PLUGIN_NAME", raising=False)
    monkeypatch.delenv("NRI_PLUGIN_IDX", raising=False)
    assert launched_identity("tessera", "50") == ("tessera", "50")
    monkeypatch.setenv("NRI_PLUGIN_NAME", "10-gpu")  # NRI v0.3 passed NN-name
    monkeypatch.setenv("NRI_PLUGIN_IDX", "10")
    assert launched_identity("tessera", "50") == ("gpu", "10")


def test_launched_by_the_runtime_with_only_the_nri_environment(tmp_path: Path) -> None:
    """As containerd launches a plugin: no arguments it did not configure, an environment of
    only NRI_PLUGIN_NAME/IDX/SOCKET, and the connection on an inherited descriptor."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    try:
        os.mknod(root / "dev/nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    except PermissionError:
        (root / "dev/nvidia0").symlink_to("/dev/null")
    key = tmp_path / "key"
    key.write_bytes(KEY)
    log_file = tmp_path / "plugin.log"
    gpu = GpuGrant("GPU-0f0f0f0f-0000-0000-0000-000000000000", 0, 0, 100, 1024)
    uid = "4b3f6f7e-2b0c-4c4e-8f55-1d2a3b4c5d6e"
    text = encode(
        PodAllocation(uid, "ml", "job", "node-a", (ContainerAllocation("main", gpus=(gpu,)),)),
        Keyring.single(KEY),
    )

    async def body() -> int:
        runtime_end, plugin_end = socket.socketpair()
        fd = plugin_end.fileno()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "nri_hook.cli",
            "--device-root",
            str(root),
            "--integrity-key-file",
            str(key),
            "--node-name",
            "node-a",
            "--log-format",
            "json",
            "--log-file",
            str(log_file),
            env={
                "NRI_PLUGIN_NAME": "50-tessera",
                "NRI_PLUGIN_IDX": "50",
                "NRI_PLUGIN_SOCKET": str(fd),
            },
            pass_fds=[fd],
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        plugin_end.close()
        sim = RuntimeSimulator(version=CONTAINERD_2_3, external=False)
        sim.attach(runtime_end)
        conn = await sim.next_plugin(timeout=30)
        assert conn.registration is not None and conn.registration.plugin_name == "tessera"
        pod = make_pod("job", namespace="ml", uid=uid, annotations={ALLOCATION_ANNOTATION: text})
        response = await conn.create_container(pod, make_container(pod, "main"))
        assert [d.path for d in response.adjust.linux.devices] == ["/dev/nvidia0"]
        assert {kv.key: kv.value for kv in response.adjust.env} == {
            "NVIDIA_VISIBLE_DEVICES": gpu.uuid
        }
        conn.close()  # the runtime goes away: a launched plugin exits
        code = await asyncio.wait_for(process.wait(), 20)
        await sim.stop()
        return code

    assert asyncio.run(asyncio.wait_for(body(), 60)) == 0
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]
    injected = [entry for entry in lines if entry["msg"].startswith("injected")]
    assert len(injected) == 1
    assert injected[0]["pod"] == "ml/job" and injected[0]["container"] == "main"
    assert injected[0]["level"] == "info"
    assert any("launched by the runtime" in entry["msg"] for entry in lines)
