"""The isolation layer as shipped: the default install puts HAMi-core's library on the node
before the NRI hook starts; the mps component runs the MPS supervisor and switches the hook
and the agent; bringing your own library removes the installer. In every variant the three
programs agree on the layer and its paths, and each sees the files where it looks for
them. The chart's values say the same (it lints in every variant; the e2e install test
compares what it renders with the overlays)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.cli import build_parser as agent_parser
from deviceplugin.config import DevicePluginConfig
from nri_hook.cli import build_parser as hook_parser
from nri_hook.config import NriHookConfig
from tessera_cli import config_from
from tessera_edge.host_paths import HAMI_CORE_IMAGE_DIR, mps_pid_file, under
from tessera_edge.isolation_cli import InstallConfig, MpsConfig
from tessera_edge.isolation_cli import build_parser as isolation_parser
from tests.deploy.install_modes import (
    CHART,
    DEPLOY,
    MODES,
    chart_copy,
    kustomize,
    lint,
    lint_errors,
    overlay,
    pod_templates,
)

COMPONENTS = DEPLOY / "isolation"


def _with_component(tmp_path: Path, mode: str, component: str) -> list[dict[str, Any]]:
    """An operator's kustomization: an overlay as shipped plus one isolation component."""
    folder = tmp_path / "mine"
    folder.mkdir()
    rel = os.path.relpath(DEPLOY, folder)
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [f"{rel}/overlays/{mode}"],
                "components": [f"{rel}/isolation/{component}"],
            }
        )
    )
    return kustomize(folder)


def _containers(template: dict[str, Any], key: str = "containers") -> dict[str, Any]:
    return {c["name"]: c for c in template["spec"].get(key) or []}


def _mount(template: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mounted at `path` in `container`, with the mount's readOnly."""
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == mount["name"]]
    return {"readOnly": bool(mount.get("readOnly")), **volume}


def _host_dir_seen_at(template: dict[str, Any], container: dict[str, Any], host_dir: str) -> str:
    """Where `container` sees the host folder `host_dir` (a hostPath volume)."""
    for m in container["volumeMounts"]:
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == m["name"]]
        if volume.get("hostPath", {}).get("path") == host_dir:
            path: str = m["mountPath"]
            return path
    raise AssertionError(f"{container['name']} does not mount {host_dir}")


def _programs(objs: list[dict[str, Any]]) -> dict[str, Any]:
    templates = pod_templates(objs)
    hook_t, agent_t = templates["tessera-nri-hook"], templates["tessera-device-plugin"]
    hook = _containers(hook_t)["nri-hook"]
    agent = _containers(agent_t)["agent"]
    return {
        "hook": config_from(NriHookConfig, hook_parser().parse_args(hook["args"])),
        "agent": config_from(DevicePluginConfig, agent_parser().parse_args(agent["args"])),
        "hook_template": hook_t,
        "agent_template": agent_t,
        "hook_container": hook,
        "agent_container": agent,
        "templates": templates,
    }


@pytest.mark.parametrize("mode", MODES)
def test_the_default_installs_hami_core_before_the_hook_and_the_agent_reports_it(
    mode: str,
) -> None:
    p = _programs(overlay(mode))
    hook, agent = p["hook"], p["agent"]
    assert hook.isolation == agent.isolation == "hami-core"
    assert hook.hami_core_library == agent.hami_core_library == "/usr/local/vgpu/libvgpu.so"
    library_dir = os.path.dirname(hook.hami_core_library)
    (install,) = p["hook_template"]["spec"]["initContainers"]
    assert install["command"] == ["tessera-isolation", "install"]
    args = isolation_parser().parse_args([*install["command"][1:], *install["args"]])
    config = config_from(InstallConfig, args)
    assert config.source == HAMI_CORE_IMAGE_DIR
    assert config.hami_core_library == hook.hami_core_library
    # the installer writes where the hook (read-only) and the agent (read-only) look
    seen = _host_dir_seen_at(p["hook_template"], install, library_dir)
    assert seen == under(config.host_root, library_dir)
    assert not _mount(p["hook_template"], install, seen)["readOnly"]
    hook_seen = _host_dir_seen_at(p["hook_template"], p["hook_container"], library_dir)
    assert hook_seen == under(hook.device_root, library_dir)
    assert _mount(p["hook_template"], p["hook_container"], hook_seen)["readOnly"]
    agent_seen = _host_dir_seen_at(p["agent_template"], p["agent_container"], library_dir)
    assert agent_seen == under(agent.host_root, library_dir)
    assert _mount(p["agent_template"], p["agent_container"], agent_seen)["readOnly"]
    assert install["securityContext"]["readOnlyRootFilesystem"] is True
    assert "tessera-mps" not in p["templates"]


@pytest.mark.parametrize("mode", MODES)
def test_the_mps_component_runs_the_supervisor_and_switches_hook_and_agent(
    tmp_path: Path, mode: str
) -> None:
    objs = _with_component(tmp_path, mode, "mps")
    p = _programs(objs)
    hook, agent = p["hook"], p["agent"]
    assert hook.isolation == agent.isolation == "mps"
    assert hook.mps_pipe_dir == agent.mps_pipe_dir == "/tmp/nvidia-mps"
    assert hook.mps_client_user == 0
    assert not p["hook_template"]["spec"].get("initContainers")  # no HAMi-core to install
    mps_t = p["templates"]["tessera-mps"]
    (mps,) = mps_t["spec"]["containers"]
    args = isolation_parser().parse_args([*mps["command"][1:], *mps["args"]])
    supervisor = config_from(MpsConfig, args)
    assert supervisor.mps_pipe_dir == hook.mps_pipe_dir
    assert not supervisor.multi_user  # the hook's uid rule: one user
    # the daemon's pipe folder is the host folder the hook and the agent read, at the path
    # the hook mounts into containers (the same path as on the host)
    assert _host_dir_seen_at(mps_t, mps, hook.mps_pipe_dir) == hook.mps_pipe_dir
    hook_seen = _host_dir_seen_at(p["hook_template"], p["hook_container"], hook.mps_pipe_dir)
    assert hook_seen + "/" + os.path.basename(mps_pid_file(hook.mps_pipe_dir)) == under(
        hook.device_root, mps_pid_file(hook.mps_pipe_dir)
    )
    agent_seen = _host_dir_seen_at(p["agent_template"], p["agent_container"], hook.mps_pipe_dir)
    assert agent_seen == under(agent.host_root, agent.mps_pipe_dir)
    assert _host_dir_seen_at(mps_t, mps, supervisor.mps_log_dir) == supervisor.mps_log_dir
    # what the daemon needs from the node, and the rollout that keeps clients' servers
    spec = mps_t["spec"]
    assert spec["hostPID"] is True and spec["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in mps["env"]}
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "NODE_NAME" in env
    daemonset = next(o for o in objs if o["metadata"]["name"] == "tessera-mps")
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "limits" not in mps["resources"]  # the MPS servers' memory counts here
    assert supervisor.stop_timeout < spec["terminationGracePeriodSeconds"]
    ports = {port["name"]: port["containerPort"] for port in mps["ports"]}
    assert ports["metrics"] == supervisor.metrics_port
    # the same node selector and tolerations as the hook: wherever shares are served
    hook_spec = p["hook_template"]["spec"]
    assert spec["nodeSelector"] == hook_spec["nodeSelector"]
    assert spec["tolerations"] == hook_spec["tolerations"]


@pytest.mark.parametrize("mode", MODES)
def test_bringing_your_own_library_removes_only_the_installer(tmp_path: Path, mode: str) -> None:
    mine = _with_component(tmp_path, mode, "bring-your-own-hami-core")
    p = _programs(mine)
    assert not p["hook_template"]["spec"].get("initContainers")
    assert p["hook"].isolation == p["agent"].isolation == "hami-core"
    shipped = _programs(overlay(mode))
    assert p["hook_container"] == shipped["hook_container"]
    assert p["agent_container"] == shipped["agent_container"]


def _chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return values


def test_the_chart_defaults_agree_with_the_overlays() -> None:
    values = _chart_values()
    p = _programs(overlay("second-scheduler"))
    assert values["isolation"]["hamiCore"]["install"] is True
    assert values["nriHook"]["isolation"] == p["hook"].isolation
    assert values["nriHook"]["mpsPipeDir"] == p["hook"].mps_pipe_dir
    components = yaml.safe_load((COMPONENTS / "mps" / "daemonset.yaml").read_text())
    (container,) = components["spec"]["template"]["spec"]["containers"]
    supervisor = config_from(
        MpsConfig, isolation_parser().parse_args([*container["command"][1:], *container["args"]])
    )
    assert values["isolation"]["mps"]["logDir"] == supervisor.mps_log_dir
    assert values["isolation"]["mps"]["clientUser"] == 0
    assert values["isolation"]["mps"]["updateStrategy"] == components["spec"]["updateStrategy"]
    assert values["metrics"]["mpsPort"] == supervisor.metrics_port


@pytest.mark.parametrize(
    "values",
    [
        {"nriHook": {"isolation": "mps"}},
        {"nriHook": {"isolation": "mps"}, "isolation": {"mps": {"clientUser": "any"}}},
        {"nriHook": {"isolation": "mps"}, "isolation": {"mps": {"clientUser": 1000}}},
        {
            "nriHook": {"isolation": "mps"},
            "isolation": {
                "mps": {"setComputeMode": False, "updateStrategy": {"type": "RollingUpdate"}}
            },
        },
        {"isolation": {"hamiCore": {"install": False}}},
        {"nriHook": {"isolation": "none", "allowUnisolatedSharing": True}},
    ],
)
def test_the_chart_lints_with_each_way_of_putting_the_layer_in_place(
    tmp_path: Path, values: dict[str, Any]
) -> None:
    result = lint(chart_copy(tmp_path / "tessera", values))
    assert not lint_errors(result), result


@pytest.mark.parametrize(
    "mps",
    [
        {"clientUser": "root"},
        {"clientUser": -1},
        {"clientUser": 2**32},
        {"logDir": "relative"},
        {"updateStrategy": {"type": "Recreate"}},
    ],
)
def test_the_chart_refuses_bad_isolation_values(tmp_path: Path, mps: dict[str, Any]) -> None:
    result = lint(chart_copy(tmp_path / "tessera", {"isolation": {"mps": mps}}))
    assert any(m["Path"] == "values.yaml" for m in lint_errors(result)), result
