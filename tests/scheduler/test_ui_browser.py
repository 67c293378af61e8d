"""The live allocation page in a real browser: headless Chromium (Debian's `chromium`, or
the binary named by TESSERA_CHROMIUM) opens /debug/ui of a running extender, shows every
node and the pods that hold GPUs, redraws when a pod is bound while it is open, and its
screenshot carries each pod's colour. Skipped when no Chromium is installed."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.resources import GPU
from tessera_testbed.apiserver import FakeApiServer
from tessera_testbed.browser import CHROMIUM, Browser
from tests.scheduler.helpers import (
    gang_member,
    pod,
    pod_group,
    populate,
    serving,
    share,
    wait_for,
)

# the page's palette and colour rule (scheduler_plugin.views.ui), to find a pod in the screenshot
_COLORS = ["#0969da", "#1a7f37", "#8250df", "#bf3989", "#9a6700", "#0a7f8c", "#bc4c00"]


def pod_color(key: str) -> tuple[int, int, int]:
    h = 0
    for ch in key:
        h = (h * 31 + ord(ch)) & 0xFFFFFFFF
    c = _COLORS[h % len(_COLORS)]
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not CHROMIUM:
        pytest.skip("no chromium (apt-get install chromium, or set TESSERA_CHROMIUM)")
    with tempfile.TemporaryDirectory() as profile:
        b = Browser(Path(profile))
        try:
            yield b
        finally:
            b.close()


def _has_color(png: bytes, rgb: tuple[int, int, int]) -> bool:
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGB")
    return any(color == rgb for _, color in image.getcolors(maxcolors=1 << 20) or [])


def test_the_page_shows_nodes_and_pods_and_follows_a_bind(browser: Browser) -> None:
    nodes = ["node-a", "node-b", "node-c"]
    with FakeApiServer() as fake:
        populate(fake, nodes, gpus=2)
        with serving(fake, policy="binpack") as served:
            assert served.schedule(pod("train-1", {GPU: 100}), nodes)
            port = served.service.server.port
            browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/debug/ui")
            first = wait_for(lambda: "train-1" in (t := browser.text()) and t, timeout=20)
            for node in nodes:
                assert node in first
            assert "late-2" not in first
            # bound while the page is open: the watch stream redraws it
            assert served.schedule(pod("late-2", share(30, 30)), nodes)
            second = wait_for(lambda: "late-2" in (t := browser.text()) and t, timeout=20)
            assert "default/late-2 30%" in second and "default/train-1 100%" in second
            assert "error" not in second  # drawn from the stream, not a reload after a failure
            png = browser.screenshot()
    assert png.startswith(b"\x89PNG")
    assert _has_color(png, pod_color("default/train-1"))
    assert _has_color(png, pod_color("default/late-2"))


def test_the_shell_carries_no_cluster_data_and_the_data_calls_need_credentials() -> None:
    with FakeApiServer() as fake:
        populate(fake, ["node-secret"], gpus=1)
        with serving(fake, open_debug=False) as served:
            status, page = served.http.get("/debug/ui")
            assert status == 200 and b"node-secret" not in page
            status, script = served.http.get("/debug/ui.js")
            assert status == 200 and b"node-secret" not in script
            # nothing is loaded from elsewhere: no cluster has a way out
            assert b"://" not in page and b"://" not in script
            assert page.count(b"<script") == 1 and b'<script src="/debug/ui.js">' in page
            for path in ("nodes", "overview", "search?q=node", "pending", "watch?view=overview"):
                assert served.http.get(f"/debug/{path}")[0] == 401, path
            # the page's colour rule is the one this test looks for in screenshots
            assert b"(h * 31 + ch.charCodeAt(0)) >>> 0" in script
            assert json.dumps(_COLORS).replace(" ", "").encode() in script.replace(b" ", b"")


def test_the_page_shows_use_beside_grants_and_unknown_for_an_unreadable_reading(
    browser: Browser,
) -> None:
    from tessera import resources as rn
    from tessera.usage import ContainerUsage, NodeUsage, UnattributedUsage, encode_usage

    def annotate(fake: FakeApiServer, node: str, text: str) -> None:
        patch = {"metadata": {"annotations": {rn.USAGE_ANNOTATION: text}}}
        name = rn.HEARTBEAT_LEASE_PREFIX + node
        fake.patch("leases", name, patch, namespace=rn.DEFAULT_HEARTBEAT_NAMESPACE)

    with FakeApiServer() as fake:
        populate(fake, ["node-a", "node-b"], gpus=1)
        with serving(fake) as served:
            assert served.schedule(pod("train-1", share(50, 50)), ["node-a"])
            assert served.schedule(pod("train-2", share(50, 50)), ["node-b"])
            uid = fake.get("pods", "train-1")["metadata"]["uid"]
            gpu = served.node_summary("node-a")["gpus"][0]["uuid"]
            reading = NodeUsage(
                "2026-11-22T04:20:00Z",
                (ContainerUsage(uid, "default", "train-1", "main", gpu, 3072, 40),),
                (UnattributedUsage(gpu, "host", 1024, 1),),
            )
            annotate(fake, "node-a", encode_usage(reading))
            annotate(fake, "node-b", "{hostile")
            port = served.service.server.port
            browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/debug/ui")
            text = wait_for(lambda: "not tessera" in (t := browser.text()) and t, timeout=20)
    assert "default/train-1 (main): granted 50%" in text
    assert "used 3.0 GiB, SM 40%" in text
    assert "not tessera: host 1.0 GiB (1 processes)" in text
    assert "use read 2026-11-22T04:20:00Z" in text
    # node-b: its grant is drawn, its use is unknown with the reason
    assert "default/train-2 (main): granted 50%" in text and "used -" in text
    assert "use: - (usage annotation does not parse" in text
    # the unattributed line is its own, never part of a pod's line
    assert not any("train-1" in line and "host" in line for line in text.splitlines())


PENDING = '(document.getElementById("pending") || {}).innerText'  # null before it loads


def test_why_pending_shows_a_waiting_gang_and_its_member(browser: Browser) -> None:
    with FakeApiServer() as fake:
        populate(fake, ["node-a", "node-b"], gpus=2)
        fake.create("podgroups", pod_group("llama", 3))
        with serving(fake) as served:
            gangs = served.service.gangs
            assert gangs is not None
            wait_for(lambda: gangs.groups_synced.is_set() and gangs.members_synced.is_set())
            first = fake.create("pods", gang_member("llama-0", "llama", 1))
            fake.create("pods", gang_member("llama-1", "llama", 1))
            wait_for(lambda: len(gangs.waiting()[0]) == 1 and gangs.waiting()[0][0]["members"] == 2)
            assert not served.filter(first, ["node-a", "node-b"])["NodeNames"]
            port = served.service.server.port
            browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/debug/ui")
            table = wait_for(
                lambda: "llama-0" in (t := browser.evaluate(PENDING) or "") and t,
                timeout=20,
            )
    (row,) = [line for line in table.splitlines() if line.startswith("llama\t")]
    cells = row.split("\t")
    assert cells[1] == "ml" and cells[2] == "2 pending, 0 bound; minMember 3"
    assert cells[3] == "gang ml/llama: 2 of 3 members pending"
    assert cells[4] == "none" and cells[5] == "llama-0, llama-1"
    # the member's row (its cells span lines: each reason is a line of its own)
    member = table.split("\nml/llama-0\t", 1)[1]
    assert member.startswith("main: 1 whole GPU\t")
    assert "gang ml/llama: 2 of 3 members pending" in member
    assert "member of gang ml/llama: placed with the whole gang or not at all" in member
    assert "% of the ask free" not in member  # no nearest fit of its own
