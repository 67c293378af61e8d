"""High availability of two replicas (Lease leader election) and the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_plugin.cli import build_parser
from scheduler_plugin.service import Service
from scheduler_plugin.views.metrics import sample
from tessera.policy_registry import POLICIES
from tessera.record import Keyring
from tessera_testbed.apiserver import FakeApiServer
from tests.keyfiles import write_private
from tests.scheduler.helpers import (
    KEYRING,
    ROOT,
    Http,
    Served,
    client_for,
    options,
    pod,
    populate,
    running,
    share,
    wait_for,
)

LEADER = "tessera_scheduler_leader"


def test_two_replicas_only_the_leader_answers_and_a_standby_takes_over(fake: FakeApiServer) -> None:
    populate(fake, ["n"], gpus=1)
    # short enough for a test, long enough that a busy CI machine does not make leaders flap
    fast = {"leader_elect": True, "lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}
    first = Service(options(identity="first", **fast), client_for(fake), KEYRING).start()
    assert first.wait_ready()
    second = Service(options(identity="second", **fast), client_for(fake), KEYRING).start()
    try:
        wait_for(lambda: second.synced)
        assert Http(second.server.port).get("/readyz") == (503, b"not the leader\n")
        assert (sample(first.metrics, LEADER), sample(second.metrics, LEADER)) == (1.0, 0.0)
        assert (
            Http(second.server.port).post("/filter", {"Pod": pod("x"), "NodeNames": []})[0] == 503
        )
        assert Served.over(fake, first).schedule(pod("a", share(50, 50)), ["n"]) == "n"
        first.stop(release=False)  # dies without releasing: the standby waits for expiry
        assert second.wait_ready(15)
        assert sample(second.metrics, LEADER) == 1.0
        wait_for(lambda: not second.cache.pods.assumed() and second.cache.snapshot().allocations)
        assert Served.over(fake, second).schedule(pod("b", share(60, 60)), ["n"]) is None
        assert Served.over(fake, second).schedule(pod("c", share(50, 50)), ["n"]) == "n"
    finally:
        second.stop()


def test_a_replica_run_without_leader_election_serves_and_says_it_leads(
    fake: FakeApiServer,
) -> None:
    """It answers extender calls as a leader does (status, Events and nudges too), so its
    leader gauge is 1, as soon as it is built."""
    populate(fake, ["n"], gpus=1)
    with running(fake, leader_elect=False) as service:
        assert service.leader is None and service.answering()
        assert sample(service.metrics, LEADER) == 1.0
        assert Served.over(fake, service).schedule(pod("a", share(50, 50)), ["n"]) == "n"


def test_help_explains_every_flag() -> None:
    parser = build_parser()
    text = parser.format_help()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, action.option_strings
    for flag in (
        "--listen",
        "--tls-cert-file",
        "--tls-key-file",
        "--tls-client-ca-file",
        "--kubeconfig",
        "--policy",
        "--leader-elect",
        "--leader-elect-namespace",
        "--integrity-key-file",
        "--log-format",
    ):
        assert flag in text
    policy = next(a for a in parser._actions if a.dest == "policy")
    assert policy.choices is not None and sorted(policy.choices) == sorted(POLICIES)


def test_cli_refuses_a_missing_key_and_bad_tls_flags(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "scheduler_plugin.cli", *args],
            capture_output=True,
            check=False,
            text=True,
            timeout=60,
            cwd=ROOT,
        )

    missing = run("--listen=127.0.0.1:0", "--integrity-key-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    keys = write_private(Keyring.generate("k1"), tmp_path / "keys")
    key = keys / "k1.pem"
    half = run("--integrity-key-file", str(keys), "--tls-cert-file", str(key))
    hmac_key = tmp_path / "hmac-key"
    hmac_key.write_text("x" * 32)
    old = run("--listen=127.0.0.1:0", "--integrity-key-file", str(hmac_key))
    assert old.returncode == 2 and "not a PEM key" in old.stderr
    public = run(
        "--listen=127.0.0.1:0",
        "--integrity-key-file",
        str(keys),
        "--legacy-hmac-key-file",
        str(tmp_path / "no"),
    )
    assert public.returncode == 2 and "legacy HMAC key file does not exist" in public.stderr
    assert half.returncode == 2 and "go together" in half.stderr
    usage = run("--listen", "nope")
    assert usage.returncode == 2 and "HOST:PORT" in usage.stderr


def test_replicas_sharing_a_host_and_a_pid_get_distinct_identities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two hostNetwork replicas on one host are both pid 1 in their PID namespaces."""
    import os
    import socket

    from scheduler_plugin.service import default_identity

    monkeypatch.setattr(os, "getpid", lambda: 1)
    monkeypatch.setenv("POD_NAME", "tessera-scheduler-7f9c-abcde")
    first = default_identity()
    monkeypatch.setenv("POD_NAME", "tessera-scheduler-7f9c-fghij")
    second = default_identity()
    assert first != second and first.startswith("tessera-scheduler-7f9c-abcde")
    monkeypatch.delenv("POD_NAME")
    assert default_identity() == f"{socket.gethostname()}_1"
