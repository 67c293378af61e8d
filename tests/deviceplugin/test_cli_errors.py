"""Every bad flag, path or topology: one line on stderr naming the flag, exit status 2, no
traceback, nothing started."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from deviceplugin.cli import main
from tessera_cli.paths import MAX_SOCKET_PATH_BYTES
from tessera_testbed.kubelet import fake_agent_command

pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "no-gpus.yaml").write_text("gpus: []\nrdma: []\n")
    (tmp_path / "only-rdma.yaml").write_text("rdma: []\n")
    (tmp_path / "all-broken.yaml").write_text(
        yaml.safe_dump({"gpus": [{"uuid": "GPU-a", "model": "T4", "memoryMiB": -1}]})
    )
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00gpus")
    (tmp_path / "a-file").write_text("x")
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


CASES: list[tuple[str, list[str], str, str]] = [
    # (id, flags, the flag named, what the line says)
    ("empty topology", ["--topology", "{f}/empty.yaml"], "--topology", "is empty"),
    ("missing topology", ["--topology", "{f}/nope.yaml"], "--topology", "does not exist"),
    ("topology is a dir", ["--topology", "{f}"], "--topology", "not a regular file"),
    ("no GPUs", ["--topology", "{f}/no-gpus.yaml"], "--topology", "no usable GPUs"),
    ("only rdma", ["--topology", "{f}/only-rdma.yaml"], "--topology", "no usable GPUs"),
    ("all broken", ["--topology", "{f}/all-broken.yaml"], "--topology", "1 broken entries"),
    ("not a mapping", ["--topology", "{f}/list.yaml"], "--topology", "expected a mapping"),
    ("binary topology", ["--topology", "{f}/binary.yaml"], "--topology", "binary.yaml"),
    ("no topology", ["--topology", ""], "--topology", "needs --topology"),
    ("dir is /proc", ["--device-plugin-dir", "/proc"], "--device-plugin-dir", "unix socket"),
    ("dir under /proc", ["--device-plugin-dir", "/proc/1/x"], "--device-plugin-dir", "cannot"),
    ("dir is a file", ["--device-plugin-dir", "{f}/a-file"], "--device-plugin-dir", "not a dir"),
    (
        "dir too long",
        ["--device-plugin-dir", "{f}/" + "d" * MAX_SOCKET_PATH_BYTES],
        "--device-plugin-dir",
        "unix socket limit",
    ),
    (
        "kubelet socket is a file",
        ["--kubelet-socket", "{f}/a-file"],
        "--kubelet-socket",
        "not a socket",
    ),
    (
        "port-like huge number",
        ["--memory-unit-mib", "99999999999"],
        "--memory-unit-mib",
        "must be 1..",
    ),
    ("unit above GPU memory", ["--memory-unit-mib", "99999"], "--memory-unit-mib", "smallest GPU"),
    ("unit too small", ["--memory-unit-mib", "1"], "--memory-unit-mib", "at least"),
    ("not a number", ["--memory-unit-mib", "lots"], "--memory-unit-mib", "not a whole number"),
    ("digits", ["--memory-unit-mib", "9" * 5000], "--memory-unit-mib", "not a number"),
    ("nan", ["--heartbeat-interval", "nan"], "--heartbeat-interval", "finite"),
    ("inf", ["--resync-interval", "inf"], "--resync-interval", "finite"),
    ("huge wait", ["--health-query-interval", "1e300"], "--health-query-interval", "at most"),
    ("negative", ["--health-recovery-seconds", "-1"], "--health-recovery-seconds", "0 or above"),
    ("zero poll", ["--socket-poll-interval", "0"], "--socket-poll-interval", "above 0"),
    ("lease", ["--lease-duration", "0"], "--lease-duration", "must be 1.."),
    ("lease vs beat", ["--lease-duration", "5"], "--lease-duration", "--heartbeat-interval"),
    ("node name", ["--node-name", "../../etc"], "--node-name", "not a valid node name"),
    ("node name caps", ["--node-name", "Node_1"], "--node-name", "not a valid node name"),
    ("namespace", ["--heartbeat-namespace", "a/b"], "--heartbeat-namespace", "not a valid"),
    ("xids", ["--health-ignore-xids", "13,x"], "--health-ignore-xids", "x"),
    ("backend", ["--backend", "cuda"], "--backend", "invalid choice"),
    ("no nvml", ["--backend", "nvml"], "--backend nvml", "NVML"),
    (
        "rdma topology without fake",
        ["--rdma", "topology", "--backend", "nvml"],
        "--backend",
        "NVML",
    ),
    ("kubeconfig missing", ["--kubeconfig", "{f}/nope"], "--kubeconfig", "does not exist"),
    ("kubeconfig garbage", ["--kubeconfig", "{f}/list.yaml"], "--kubeconfig", "cannot configure"),
    ("kube context", ["--kube-context", " "], "--kube-context", "may not be empty"),
    ("unknown flag", ["--metrics-prot", "9465"], "--metrics-prot", "unrecognized"),
    ("port out of range", ["--metrics-port", "99999"], "--metrics-port", "0..65535"),
]


@pytest.mark.parametrize(
    ("flags", "flag", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_flag_is_one_line_and_status_2(
    flags: list[str],
    flag: str,
    says: str,
    files: Path,
    sock_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--backend", "fake", "--topology", "t4-4x", "--device-plugin-dir", str(sock_dir)]
    argv += ["--log-level", "error", "--kubeconfig", str(files / "a-file")]
    if "--kubeconfig" not in flags and "--lease-duration" not in flags:
        argv.append("--no-inventory")
    argv += [f.format(f=files) for f in flags]
    rc, err = _run(argv, capsys)
    assert rc == 2, err
    # a broken topology entry is also logged where it is skipped (level error)
    lines = [line for line in err.splitlines() if line.strip() and "skipped a device" not in line]
    assert len(lines) == 1, err
    (line,) = lines
    assert line.startswith("tessera-device-plugin: error: ")
    assert flag in line and says in line, line
    assert "Traceback" not in err
    assert not list(sock_dir.glob("*.sock"))  # nothing was served


def test_the_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    argv, env = fake_agent_command("/proc", "t4-4x", "--no-inventory", "--log-level", "warning")
    proc = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tessera-device-plugin: error: --device-plugin-dir: cannot create a unix socket in "
        "/proc: No such file or directory"
    ]


def test_help_explains_limits_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for needed in ("exit status", "one line", "--device-plugin-dir", "must be longer than"):
        assert needed in out
