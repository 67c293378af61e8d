"""tessera-scheduler's command line: every bad flag, port, address or file is one line on
stderr naming the flag and what is wrong, exit status 2, no traceback."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_plugin.cli import build_parser, main
from scheduler_plugin.config import SchedulerConfig
from scheduler_plugin.service import Options
from tessera.resources import DEFAULT_POLICY
from tessera_cli.parser import config_from
from tests.scheduler.helpers import ROOT


@pytest.fixture
def files(tmp_path: Path, pki: Path) -> dict[str, str]:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    unreadable = tmp_path / "folder"
    unreadable.mkdir()
    return {
        "crt": str(pki / "server.crt"),
        "key": str(pki / "server.key"),
        "ca": str(pki / "ca.crt"),
        "other_key": str(pki / "client.key"),
        "garbage": str(garbage),
        "folder": str(unreadable),
        "missing": str(tmp_path / "missing.pem"),
    }


CASES = [
    (["--listen", "0.0.0.0:99999"], "--listen", "not in 0..65535"),
    (["--listen", "nope"], "--listen", "HOST:PORT"),
    (["--listen", "example.com:8443"], "--listen", "IP address"),
    (["--health-listen", "1.2.3.4:-1"], "--health-listen", "HOST:PORT"),
    (
        ["--listen", "127.0.0.1:8081", "--health-listen", "127.0.0.1:8081"],
        "--health-listen",
        "ports",
    ),
    (["--listen", "0.0.0.0:8443"], "--listen 0.0.0.0", "--insecure-allow-unauthenticated"),
    (
        ["--listen", "10.0.0.1:8443", "--tls-cert-file={crt}", "--tls-key-file={key}"],
        "--tls-client-ca-file",
        "loopback",
    ),
    (["--tls-cert-file={missing}", "--tls-key-file={key}"], "--tls-cert-file", "does not exist"),
    (["--tls-cert-file={crt}", "--tls-key-file={folder}"], "--tls-key-file", "not a regular file"),
    (["--tls-cert-file={crt}"], "--tls-key-file", "go together"),
    (["--tls-client-ca-file={ca}"], "--tls-client-ca-file", "needs --tls-cert-file"),
    (["--tls-cert-file={garbage}", "--tls-key-file={key}"], "--tls-cert-file", "not a PEM"),
    (["--tls-cert-file={crt}", "--tls-key-file={other_key}"], "--tls-key-file", "not a PEM"),
    (
        ["--tls-cert-file={crt}", "--tls-key-file={key}", "--tls-client-ca-file={garbage}"],
        "--tls-client-ca-file",
        "not a PEM CA",
    ),
    (["--api-timeout", "-1"], "--api-timeout", "above 0"),
    (["--heartbeat-grace", "nan"], "--heartbeat-grace", "finite"),
    (["--leader-elect-lease-duration", "inf"], "--leader-elect-lease-duration", "finite"),
    (["--max-body-bytes", "12"], "--max-body-bytes", "1024"),
    (["--policy", "nope"], "--policy", "invalid choice"),
    (["--nri-plugin-name", "my hook"], "--nri-plugin-name", "not an NRI plugin name"),
    (["--nri-plugin-name", ""], "--nri-plugin-name", "not an NRI plugin name"),
    (["--heartbeat-namespace", "Kube_System"], "--heartbeat-namespace", "DNS-1123 label"),
    (["--heartbeat-namespace", "a" * 64], "--heartbeat-namespace", "namespace"),
    (["--leader-elect-namespace", "../x"], "--leader-elect-namespace", "DNS-1123 label"),
]


@pytest.mark.parametrize(("argv", "flag", "why"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_flags_are_one_line_naming_the_flag(
    files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    flag: str,
    why: str,
) -> None:
    argv = [a.format(**files) for a in argv]
    if not any(a.startswith("--listen") for a in argv) and "--tls-client-ca-file" not in flag:
        argv = ["--listen=127.0.0.1:8888", *argv]
    code: str | int | None
    try:
        code = main(argv)
    except SystemExit as exited:  # argparse's own checks
        code = exited.code
    assert code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert flag in lines[0] and why in lines[0], lines[0]


def test_the_nri_plugin_requirement_names_the_flag_or_is_off() -> None:
    def service(*argv: str) -> Options:
        return config_from(SchedulerConfig, build_parser().parse_args(list(argv))).service

    assert service().nri_plugin == "tessera"
    assert service("--nri-plugin-name=tessera-gpu").nri_plugin == "tessera-gpu"
    assert service("--nri-plugin-name=tessera-gpu", "--no-require-nri-plugin").nri_plugin is None


def test_the_binary_refuses_to_serve_open_on_a_public_address_without_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler_plugin.cli", "--listen=0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "--insecure-allow-unauthenticated" in proc.stderr


def test_help_explains_the_security_flags() -> None:
    text = build_parser().format_help()
    for flag in (
        "--tls-client-ca-file",
        "--insecure-allow-unauthenticated",
        "--health-listen",
        "--max-body-bytes",
    ):
        assert flag in text
    assert "bearer token" in text and "client certificate" in text


def test_open_and_loopback_flags_parse(files: dict[str, str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["--listen=[::1]:8443", "--health-listen=:0"])
    assert args.listen == ("::1", 8443) and args.health_listen == ("0.0.0.0", 0)


def test_the_flags_default_to_what_the_service_defaults_to() -> None:
    """One place for each default: the command line starts from the service's own
    defaults, apart from the two it documents (policy, health port)."""
    config = config_from(SchedulerConfig, build_parser().parse_args([]))
    from_flags = dataclasses.replace(config.service, policy="binpack", health_port=None)
    assert from_flags == Options()
    assert config.policy == DEFAULT_POLICY and config.health_listen[1] == 8081
