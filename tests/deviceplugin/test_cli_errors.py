"""Every bad flag, path or topology: one line on stderr naming the flag, exit status 2, no
traceback, nothing started."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from deviceplugin.cli import main
from tessera_cli.paths import MAX_SOCKET_PATH_BYTES
from tessera_testbed.kubelet import fake_agent_command

if TYPE_CHECKING:
    from _pytest.mark import ParameterSet  # what pytest.param returns

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


def bad(case: str, flags: list[str], says: str, *, named: str | None = None) -> ParameterSet:
    """A bad command line: `flags` (`{f}` is the folder of `files`), and what its one error
    line says: the flag it names (the first of `flags` unless `named`) and why."""
    return pytest.param(flags, named or flags[0], says, id=case)


CASES = [
    bad("empty topology", ["--topology", "{f}/empty.yaml"], "is empty"),
    bad("missing topology", ["--topology", "{f}/nope.yaml"], "does not exist"),
    bad("topology is a dir", ["--topology", "{f}"], "not a regular file"),
    bad("no GPUs", ["--topology", "{f}/no-gpus.yaml"], "no usable GPUs"),
    bad("only rdma", ["--topology", "{f}/only-rdma.yaml"], "no usable GPUs"),
    bad("all broken", ["--topology", "{f}/all-broken.yaml"], "1 broken entries"),
    bad("not a mapping", ["--topology", "{f}/list.yaml"], "expected a mapping"),
    bad("binary topology", ["--topology", "{f}/binary.yaml"], "binary.yaml"),
    bad("no topology", ["--topology", ""], "needs --topology"),
    bad("dir is /proc", ["--device-plugin-dir", "/proc"], "unix socket"),
    bad("dir under /proc", ["--device-plugin-dir", "/proc/1/x"], "cannot"),
    bad("dir is a file", ["--device-plugin-dir", "{f}/a-file"], "not a dir"),
    bad(
        "dir too long",
        ["--device-plugin-dir", "{f}/" + "d" * MAX_SOCKET_PATH_BYTES],
        "unix socket limit",
    ),
    bad("kubelet socket is a file", ["--kubelet-socket", "{f}/a-file"], "not a socket"),
    bad("port-like huge number", ["--memory-unit-mib", "99999999999"], "must be 1.."),
    bad("unit above GPU memory", ["--memory-unit-mib", "99999"], "smallest GPU"),
    bad("unit too small", ["--memory-unit-mib", "1"], "at least"),
    bad("not a number", ["--memory-unit-mib", "lots"], "not a whole number"),
    bad("digits", ["--memory-unit-mib", "9" * 5000], "not a number"),
    bad("nan", ["--heartbeat-interval", "nan"], "finite"),
    bad("inf", ["--resync-interval", "inf"], "finite"),
    bad("huge wait", ["--health-query-interval", "1e300"], "at most"),
    bad("negative", ["--health-recovery-seconds", "-1"], "0 or above"),
    bad("zero poll", ["--socket-poll-interval", "0"], "above 0"),
    bad("lease", ["--lease-duration", "0"], "must be 1.."),
    bad("lease vs beat", ["--lease-duration", "5"], "--heartbeat-interval"),
    bad("node name", ["--node-name", "../../etc"], "not a valid node name"),
    bad("node name caps", ["--node-name", "Node_1"], "not a valid node name"),
    bad("namespace", ["--heartbeat-namespace", "a/b"], "not a valid"),
    bad("xids", ["--health-ignore-xids", "13,x"], "x"),
    bad("backend", ["--backend", "cuda"], "invalid choice"),
    bad("no nvml", ["--backend", "nvml"], "NVML", named="--backend nvml"),
    bad(
        "rdma topology without fake",
        ["--rdma", "topology", "--backend", "nvml"],
        "NVML",
        named="--backend",
    ),
    bad("kubeconfig missing", ["--kubeconfig", "{f}/nope"], "does not exist"),
    bad("kubeconfig garbage", ["--kubeconfig", "{f}/list.yaml"], "cannot configure"),
    bad("kube context", ["--kube-context", " "], "may not be empty"),
    bad("unknown flag", ["--metrics-prot", "9465"], "unrecognized"),
    bad("port out of range", ["--metrics-port", "99999"], "0..65535"),
    bad("proc root missing", ["--proc-root", "{f}/nope"], "is not a directory"),
    bad("proc root is a file", ["--proc-root", "{f}/a-file"], "not a dir"),
    bad("usage interval", ["--usage-interval", "-5"], "0 or above"),
]


@pytest.mark.parametrize(("flags", "flag", "says"), CASES)
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
