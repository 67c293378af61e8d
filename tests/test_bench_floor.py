"""`make bench-scale --floor`'s stand-in extender, spoken to as kube-scheduler would: mutual
TLS, a filter call and a bind call on one kept-alive connection, the Binding written to a
(simulated) API server; its health port answers what the benchmark reads."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.common import ROOT
from bench.scale_common import verb_histograms
from kube_edge.client import KubeClient
from tessera_testbed.apiserver import FakeApiServer, write_kubeconfig
from tests.e2e.pki import Authority


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except OSError:
        return 0, ""


def test_the_floor_extender_filters_binds_and_counts_connections(tmp_path: Path) -> None:
    ca = Authority(tmp_path / "pki", "extender")
    serving = ca.issue("server", "tessera-scheduler", server=True)
    caller = ca.issue("client", "kube-scheduler")
    port, health = _free_port(), _free_port()
    with FakeApiServer() as fake:
        url = f"http://127.0.0.1:{fake.port}"
        api = KubeClient.for_host(url)
        api.create("/api/v1/nodes", {"metadata": {"name": "n1"}})
        made = api.create(
            "/api/v1/namespaces/default/pods",
            {"metadata": {"name": "p1", "namespace": "default"}, "spec": {"containers": []}},
        )
        cmd = [
            sys.executable,
            "-m",
            "bench.floor_extender",
            f"--kubeconfig={write_kubeconfig(tmp_path / 'kubeconfig', url)}",
            f"--listen=127.0.0.1:{port}",
            f"--health-listen=127.0.0.1:{health}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-key-file={serving.key}",
            f"--tls-client-ca-file={ca.path}",
            "--leader-elect",  # tessera-scheduler's other flags are ignored
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with (tmp_path / "stderr").open("wb") as err:
            proc = subprocess.Popen(cmd, env=env, stderr=err)
        try:
            deadline = time.monotonic() + 60
            while _get(f"http://127.0.0.1:{health}/readyz")[0] != 200:
                assert proc.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
                assert time.monotonic() < deadline, "the floor extender never became ready"
                time.sleep(0.2)
            tls = ssl.create_default_context(cafile=str(ca.path))
            tls.load_cert_chain(str(caller.cert), str(caller.key))
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
            args = {"Pod": made, "NodeNames": ["n1", "n2"]}
            conn.request("POST", "/filter", json.dumps(args), {"Content-Type": "application/json"})
            reply = json.loads(conn.getresponse().read())
            assert reply["NodeNames"] == ["n1"] and reply["Error"] == ""
            bind = {
                "PodName": "p1",
                "PodNamespace": "default",
                "PodUID": made["metadata"]["uid"],
                "Node": "n1",
            }
            conn.request("POST", "/bind", json.dumps(bind), {"Content-Type": "application/json"})
            assert json.loads(conn.getresponse().read()) == {"Error": ""}
            conn.close()
            assert api.get("/api/v1/namespaces/default/pods/p1")["spec"]["nodeName"] == "n1"
            status, text = _get(f"http://127.0.0.1:{health}/metrics")
            assert status == 200 and "tessera_scheduler_connections_total 1" in text
            # each call's time, read as the benchmark reads tessera-scheduler's
            verbs = verb_histograms(text)
            assert {v: verbs[v].count for v in verbs} == {"filter": 1, "bind": 1}
            assert 0 < verbs["bind"].quantile(0.99) < 5
            # a caller without a client certificate is refused at the handshake
            bare = ssl.create_default_context(cafile=str(ca.path))
            refused = http.client.HTTPSConnection("127.0.0.1", port, context=bare, timeout=10)
            try:
                refused.request("POST", "/filter", "{}")
                refused.getresponse()
            except (ssl.SSLError, ConnectionError):
                pass
            else:
                raise AssertionError("a caller without a client certificate was answered")
            finally:
                refused.close()
        finally:
            proc.kill()
            proc.wait()


def test_the_plain_floor_answers_filter_calls_on_a_kept_alive_connection() -> None:
    from bench.floor_extender import serve_plain

    port, stop = serve_plain()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for names in (["a", "b"], ["c"], []):
            body = json.dumps({"Pod": {}, "NodeNames": names})
            conn.request("POST", "/filter", body, {"Content-Type": "application/json"})
            reply = json.loads(conn.getresponse().read())
            assert reply["NodeNames"] == names[:1]
            assert bool(reply["Error"]) == (not names)
        conn.close()
    finally:
        stop()
