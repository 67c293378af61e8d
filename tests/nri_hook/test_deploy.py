"""The deploy files agree with the command line and with containerd's configuration keys."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import yaml

from nri_hook.cli import build_parser
from nri_hook.plugin import DEFAULT_SOCKET_PATH

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nri-hook"


def test_daemonset_arguments_are_valid_flags() -> None:
    doc = yaml.safe_load((DEPLOY / "daemonset.yaml").read_text())
    assert doc["kind"] == "DaemonSet"
    spec = doc["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["command"] == ["tessera-nri-hook"]
    args = build_parser().parse_args(container["args"])
    assert args.socket == DEFAULT_SOCKET_PATH
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "/var/run/nri" in mounts
    assert f"{args.device_root}/dev" in mounts  # devices are read where they are mounted
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    assert args.integrity_key_file.startswith(
        next(p for p, m in mounts.items() if m["name"] == "record-keys")
    )
    volumes = {v["name"]: v for v in spec["volumes"]}
    # public keys only: a node verifies records and can never mint one
    assert volumes["record-keys"]["secret"]["secretName"] == "tessera-record-verify"
    assert spec["hostNetwork"] is True
    assert set(container["securityContext"]["capabilities"]["add"]) == {"NET_ADMIN", "SYS_ADMIN"}


def test_containerd_snippets_enable_nri_with_external_connections() -> None:
    for name, version in [("containerd-1.7-nri.toml", 2), ("containerd-2.x-nri.toml", 3)]:
        doc = tomllib.loads((DEPLOY / name).read_text())
        assert doc["version"] == version
        nri = doc["plugins"]["io.containerd.nri.v1.nri"]
        assert nri["disable"] is False
        assert nri["disable_connections"] is False
        assert nri["socket_path"] == DEFAULT_SOCKET_PATH


def test_containerd_2_refuses_record_pods_containers_without_the_hook() -> None:
    """The 2.x snippet turns on NRI's default validator (2.2+), which enforces the
    required-plugins annotation the scheduler writes; it requires nothing node-wide (that
    would hold back static pods). 1.7 has no validator: its table is not there."""
    nri_2 = tomllib.loads((DEPLOY / "containerd-2.x-nri.toml").read_text())
    validator = nri_2["plugins"]["io.containerd.nri.v1.nri"]["default_validator"]
    assert validator == {"enable": True}
    nri_17 = tomllib.loads((DEPLOY / "containerd-1.7-nri.toml").read_text())
    assert "default_validator" not in nri_17["plugins"]["io.containerd.nri.v1.nri"]


def test_launched_wrapper_passes_valid_flags() -> None:
    script = (DEPLOY / "launched" / "50-tessera").read_text()
    command = script[script.index("exec ") + 5 :].replace("\\\n", " ")
    words = shlex.split(command)
    assert words[0].startswith("/")  # containerd gives launched plugins no PATH
    build_parser().parse_args(words[1:])
