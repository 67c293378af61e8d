"""The command line, and the plugin run the way containerd launches it."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from nri_hook.cli import build_parser, check_isolation, launched_identity, main
from nri_hook.config import NriHookConfig
from tessera.allocation import ContainerAllocation, GpuGrant, PodAllocation
from tessera.record import Keyring, encode
from tessera.resources import ALLOCATION_ANNOTATION
from tessera_cli import config_from
from tessera_testbed.containerd import CONTAINERD_2_3, RuntimeSimulator, make_container, make_pod
from tests.keyfiles import write_public

KEY = Keyring.generate("k1")


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


@pytest.mark.usefixtures("restore_logging")
def test_flags_are_validated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad_index:
        main(["--plugin-index", "7", "--no-integrity", "--socket", str(tmp_path / "nri.sock")])
    assert bad_index.value.code == 2
    assert "two digits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--isolation", "vgpu"])
    with pytest.raises(SystemExit) as bad_key:
        main(
            [
                "--socket",
                str(tmp_path / "nri.sock"),
                "--isolation=hami-core",
                "--integrity-key-file",
                str(tmp_path / "absent"),
                "--log-file",
                str(tmp_path / "log"),
            ]
        )
    assert bad_key.value.code == 2
    assert "does not exist" in capsys.readouterr().err
    assert "does not exist" in (tmp_path / "log").read_text()


@pytest.mark.usefixtures("restore_logging")
def test_without_an_isolation_layer_the_hook_refuses_to_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, sock_dir: Path
) -> None:
    """GPU shares unlimited must be chosen twice; the one line says how to choose."""
    for name in ("NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX", "TESSERA_ISOLATION"):
        monkeypatch.delenv(name, raising=False)
    base = ["--socket", str(sock_dir / "nri.sock"), "--device-root", "/", "--no-integrity"]

    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as exited:
            main([*base, *args])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and len(err.strip().splitlines()) == 1, err
        return err.strip()

    assert refused() == (
        "tessera-nri-hook: error: --isolation: no GPU isolation layer chosen, so GPU shares would "
        "not be limited in memory or compute: choose mps or hami-core (docs/isolation.md), "
        "or none together with --allow-unisolated-sharing"
    )
    assert refused("--isolation=none") == (
        "tessera-nri-hook: error: --isolation none: GPU shares would not be limited in memory or "
        "compute: choose mps or hami-core (docs/isolation.md), or add "
        "--allow-unisolated-sharing to accept that"
    )
    # the environment twins: the variable is named when the value came from it
    monkeypatch.setenv("TESSERA_ISOLATION", "none")
    assert "TESSERA_ISOLATION" in refused()
    monkeypatch.setenv("TESSERA_ALLOW_UNISOLATED_SHARING", "true")
    config = config_from(NriHookConfig, build_parser().parse_args(base))
    assert check_isolation(config) == "none"
    monkeypatch.setenv("TESSERA_ISOLATION", "hami-core")
    monkeypatch.delenv("TESSERA_ALLOW_UNISOLATED_SHARING")
    config = config_from(NriHookConfig, build_parser().parse_args(base))
    assert check_isolation(config) == "hami-core"


def test_the_mps_client_user_is_a_uid_or_any(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_MPS_CLIENT_USER", raising=False)
    parse = build_parser().parse_args
    assert parse([]).mps_client_user == 0  # the default: root's containers
    assert parse(["--mps-client-user", "1000"]).mps_client_user == 1000
    assert parse(["--mps-client-user", "any"]).mps_client_user is None
    assert parse(["--mps-client-user", "ANY"]).mps_client_user is None
    monkeypatch.setenv("TESSERA_MPS_CLIENT_USER", "any")
    assert parse([]).mps_client_user is None


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
    key = write_public(KEY, tmp_path / "keys")
    log_file = tmp_path / "plugin.log"
    gpu = GpuGrant("GPU-0f0f0f0f-0000-0000-0000-000000000000", 0, 0, 100, 1024)
    uid = "4b3f6f7e-2b0c-4c4e-8f55-1d2a3b4c5d6e"
    text = encode(
        PodAllocation(uid, "ml", "job", "node-a", (ContainerAllocation("main", gpus=(gpu,)),)),
        KEY,
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
            "--isolation=none",
            "--allow-unisolated-sharing",
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


# --- every bad flag, path or descriptor: one line naming it, exit 2, no traceback --------------


def _bad_flag_cases(tmp: Path) -> list[tuple[list[str], dict[str, str], str]]:
    not_a_socket = tmp / "plain-file"
    not_a_socket.write_text("")
    empty_dir = tmp / "no-keys"
    empty_dir.mkdir()
    ok = ["--no-integrity"]
    return [
        (["--plugin-index", "7", *ok], {}, "--plugin-index"),
        (["--plugin-name", "bad name", *ok], {}, "--plugin-name"),
        (["--registration-timeout", "soon", *ok], {}, "--registration-timeout"),
        (["--registration-timeout", "-1", *ok], {}, "--registration-timeout"),
        (["--registration-timeout", "nan", *ok], {}, "--registration-timeout"),
        (["--registration-timeout", "inf", *ok], {}, "--registration-timeout"),
        (["--metrics-port", "70000", *ok], {}, "--metrics-port"),
        (["--metrics-port", "-5", *ok], {}, "--metrics-port"),
        (["--metrics-port", "http", *ok], {}, "--metrics-port"),
        (["--socket", "/nonexistent-tessera-dir/nri.sock", *ok], {}, "--socket"),
        (["--socket", "/tmp/" + "s" * 120, *ok], {}, "--socket"),
        (["--socket", str(not_a_socket), *ok], {}, "--socket"),
        (["--integrity-key-file", str(tmp / "absent")], {}, "--integrity-key-file"),
        (["--integrity-key-file", str(empty_dir)], {}, "--integrity-key-file"),
        (["--device-root", str(tmp / "absent"), *ok], {}, "--device-root"),
        (["--log-file", str(tmp / "absent" / "log"), *ok], {}, "--log-file"),
        (["--isolation", "vgpu", *ok], {}, "--isolation"),
        (["--mps-pipe-dir", "relative/dir", *ok], {}, "--mps-pipe-dir"),
        (["--hami-core-library", "libvgpu.so", *ok], {}, "--hami-core-library"),
        (["--mps-client-user", "root", *ok], {}, "--mps-client-user"),
        (["--mps-client-user", "-1", *ok], {}, "--mps-client-user"),
        (["--mps-client-user", str(2**32), *ok], {}, "--mps-client-user"),
        (["--vf-rename-prefix", "p" * 20, *ok], {}, "--vf-rename-prefix"),
        (["--vf-rename-prefix", "a/b", *ok], {}, "--vf-rename-prefix"),
        (["--node-name", "Not A Node", *ok], {}, "--node-name"),
        (["--metrics-address", "no such address!", "--metrics-port", "1", *ok], {}, "address"),
        (ok, {"NRI_PLUGIN_SOCKET": "three"}, "NRI_PLUGIN_SOCKET"),
        (ok, {"NRI_PLUGIN_SOCKET": "987654"}, "NRI_PLUGIN_SOCKET"),
        (ok, {"NRI_PLUGIN_IDX": "7"}, "NRI_PLUGIN_IDX"),
        (ok, {"NRI_PLUGIN_NAME": "50-bad name"}, "NRI_PLUGIN_NAME"),
    ]


@pytest.mark.usefixtures("restore_logging")
def test_each_bad_flag_is_one_line_naming_it_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    sock_dir: Path,
) -> None:
    for name in ("NRI_PLUGIN_SOCKET", "NRI_PLUGIN_NAME", "NRI_PLUGIN_IDX"):
        monkeypatch.delenv(name, raising=False)
    base = ["--socket", str(sock_dir / "nri.sock"), "--device-root", "/", "--isolation=mps"]
    for args, env, flag in _bad_flag_cases(tmp_path):
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            with pytest.raises(SystemExit) as exited:
                main([*base, *args])
        err = capsys.readouterr().err
        assert exited.value.code == 2, (args, env, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (args, env, err)
        assert flag in lines[0], (args, env, err)
        assert "Traceback" not in err


@pytest.mark.usefixtures("restore_logging")
def test_a_metrics_port_in_use_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], sock_dir: Path, busy_port: int
) -> None:
    port = busy_port
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "--socket",
                str(sock_dir / "nri.sock"),
                "--no-integrity",
                "--isolation=hami-core",
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                str(port),
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2
    assert len(err) == 1 and "--metrics-port" in err[0] and str(port) in err[0]
