"""What a serving scheduler has imported: none of the modules it does not use. Each name
below was once loaded and cost resident memory (docs/scheduler.md, "Performance")."""

from __future__ import annotations

import subprocess
import sys

# a Service serving HTTP (no API server: its informers are never started) answers a filter,
# a prioritize and a /metrics scrape, then prints sys.modules
_SERVING = """
import http.client, json, sys
from kube_edge.client import KubeClient
from scheduler_plugin.service import Options, Service
from tests.scheduler.helpers import KEYRING, pod, share
options = Options(host="127.0.0.1", port=0, leader_elect=False, write_status=False)
service = Service(options, KubeClient.for_host("http://127.0.0.1:9"), KEYRING)
service.server.start()
conn = http.client.HTTPConnection("127.0.0.1", service.server.port)
args = json.dumps({"Pod": pod("p", share(10, 10), uid="u"), "NodeNames": ["a", "b"]})
for path in ("/filter", "/prioritize"):
    conn.request("POST", path, body=args)
    conn.getresponse().read()
conn.request("GET", "/metrics")
assert conn.getresponse().status == 200
service.server.stop()
print("\\n".join(sorted(sys.modules)))
"""

NOT_LOADED = frozenset(
    {
        # uvicorn's package __init__ imports its command line (scheduler_plugin/__init__.py)
        "uvicorn.main",
        "click",
        # HTTP/2 is served only with --http2 (scheduler_plugin/serving/protocol.py)
        "h2",
        "hpack",
        "hyperframe",
    }
)


def test_a_serving_scheduler_does_not_import_what_it_does_not_use() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _SERVING], capture_output=True, text=True, check=True
    )
    loaded = set(out.stdout.split())
    assert "uvicorn.server" in loaded and "scheduler_plugin.decisions.extender" in loaded
    assert not NOT_LOADED & loaded
