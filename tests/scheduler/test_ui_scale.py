"""The allocation page at 5,000 nodes x 8 GPUs in headless Chromium: the figures per model
are the scheduler's, every GPU has its cell in the colour of its allocation, nodes that
take no pods are ringed, a search finds a pod, and a bind while the page is open recolours
the granted GPU's cell. Its speed (first paint, time to recolour, the scheduler's CPU) is
measured by `make bench` (bench/bench_ui.py), not asserted here. Skipped without Chromium.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.ui_page import FENCED, NOT_READY, PageCluster, chromium, open_page, page_cluster
from tessera.capacity import ModelCapacity, by_model
from tessera.resources import GPU
from tessera_testbed.browser import CHROMIUM, Browser, wait_for

NODES = 5000
# the page's palette (scheduler_plugin/views/ui.js)
FREE, PART, MOST, FULL = (220, 235, 221), (140, 191, 224), (58, 127, 192), (11, 61, 117)
NOT_READY_RING, FENCE_RING = (188, 76, 0), (207, 34, 46)


@pytest.fixture(scope="module")
def big() -> Iterator[tuple[PageCluster, Browser]]:
    if not CHROMIUM:
        pytest.skip("no chromium (apt-get install chromium, or set TESSERA_CHROMIUM)")
    with page_cluster(NODES) as cluster, chromium() as browser:
        first = open_page(browser, cluster.url)
        print(f"first paint at {NODES} nodes: {first:.0f} ms (measured by make bench)")
        yield cluster, browser


def _pixel(browser: Browser, node: str, gpu: int, ring: bool = False) -> tuple[int, int, int]:
    """The colour drawn at the middle of a GPU's cell (or just outside its node's block)."""
    js = f"""(() => {{
      const c = tessera.cellAt({json.dumps(node)}, {gpu}), d = devicePixelRatio;
      const x = {"c.x - 1" if ring else "c.x + c.w / 2"}, y = c.y + c.h / 2;
      const p = document.getElementById("cells").getContext("2d")
        .getImageData(Math.floor(x * d), Math.floor(y * d), 1, 1).data;
      return [p[0], p[1], p[2]];
    }})()"""
    r, g, b = browser.evaluate(js)
    return r, g, b


def _near(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """The same colour, give or take the canvas's rounding."""
    return all(abs(x - y) <= 2 for x, y in zip(a, b, strict=True))


def _expected(core: int, memory: int) -> tuple[int, int, int]:
    taken = max(core, memory)
    return FREE if taken == 0 else FULL if taken >= 100 else MOST if taken >= 50 else PART


def _model_rows(browser: Browser) -> list[dict[str, str]]:
    js = """[...document.querySelectorAll("#models tr[data-model]")].map(tr =>
      Object.fromEntries([...tr.querySelectorAll("td[data-k]")]
        .map(td => [td.dataset.k, td.childNodes[td.childNodes.length > 1 &&
          td.childNodes[0].className === "meter" ? 1 : 0].textContent])))"""
    rows: list[dict[str, str]] = browser.evaluate(js)
    return rows


def test_the_overview_shows_the_schedulers_figures(big: tuple[PageCluster, Browser]) -> None:
    cluster, browser = big
    cache = cluster.service.cache
    models: tuple[ModelCapacity, ...] = cache.reading(
        lambda r: by_model(r.decider.index, r.problems.keys())
    )
    (want,) = models  # every node is an 8x H100
    (row,) = _model_rows(browser)
    assert row["model"] == want.model
    assert row["nodes"] == f"{NODES:,}" and row["gpus"] == f"{NODES * 8:,}"
    assert row["core"] == f"{100 * want.core_used / (want.gpus * 100):.1f}%"
    assert row["memory"] == f"{100 * want.memory_used_mib / want.memory_total_mib:.1f}%"
    assert row["free"] == f"{want.whole_free:,}"
    assert row["placeable"] == f"{want.whole_placeable:,}"
    assert want.whole_placeable < want.whole_free  # the closed nodes' free GPUs do not count
    core, mib = want.shares[0]
    assert row["share"] == f"{core}% compute with {mib / 1024:.1f} GiB"
    status = browser.evaluate('document.getElementById("status").textContent')
    assert f"{NODES:,} nodes, {NODES * 8:,} GPUs" in status
    assert f"{NOT_READY + FENCED} nodes take no new pods" in status
    problems = browser.evaluate('document.getElementById("problems").innerText')
    assert problems.count("heartbeat Lease") == NOT_READY and problems.count("fenced") == FENCED


def test_every_cell_has_its_gpus_colour_and_closed_nodes_are_ringed(
    big: tuple[PageCluster, Browser],
) -> None:
    cluster, browser = big
    cache = cluster.service.cache
    problems = cache.problems.by_node()
    checked = 0
    for name in cluster.names[:: NODES // 40]:
        if name in problems:
            continue
        view = cache.node_summary(name)
        assert view is not None
        for g in view["gpus"]:
            memory = -(-g["memoryMiB"]["used"] * 100 // g["memoryMiB"]["total"])
            want = _expected(g["core"]["used"], memory)
            assert _near(_pixel(browser, name, g["index"]), want), (name, g["index"])
            checked += 1
    assert checked >= 300
    fenced = cluster.service.cache.problems.fenced()
    for name in problems:
        ring = FENCE_RING if name in fenced else NOT_READY_RING
        assert _near(_pixel(browser, name, 0, ring=True), ring), name


def test_a_search_finds_a_pod(big: tuple[PageCluster, Browser]) -> None:
    cluster, browser = big
    some = next(a for a in cluster.service.cache.snapshot().allocations.values())
    key = f"{some.namespace}/{some.name}"
    browser.evaluate(
        f"""(() => {{ const s = document.getElementById("search");
        s.value = {json.dumps(some.name)}; s.dispatchEvent(new Event("input")); }})()"""
    )
    found = wait_for(
        lambda: (
            "1 matches on 1 nodes"
            in (t := browser.evaluate('document.getElementById("found").textContent'))
            and t
        ),
        timeout=20,
    )
    assert found
    matches = browser.evaluate('document.getElementById("matches").innerText')
    assert f"pod {key} on {some.node}" in matches
    # the only node found opens with its GPUs and the pod on them
    card = wait_for(
        lambda: browser.evaluate(
            f"(document.querySelector('.node[data-node=\"{some.node}\"]') || {{}}).innerText"
        ),
        timeout=20,
    )
    assert key in card and "GPU 0" in card
    browser.evaluate(
        """(() => { const s = document.getElementById("search");
        s.value = ""; s.dispatchEvent(new Event("input")); })()"""
    )
    wait_for(lambda: not browser.evaluate('document.getElementById("found").textContent'), 20)


def test_a_bind_recolours_its_cells(big: tuple[PageCluster, Browser]) -> None:
    cluster, browser = big
    cache = cluster.service.cache
    problems = cache.problems.by_node()
    target, gpu = next(
        (name, g["index"])
        for name in cluster.names
        if name not in problems
        for g in (cache.node_summary(name) or {"gpus": []})["gpus"]
        if g["core"]["used"] == 0 and g["memoryMiB"]["used"] == 0
    )
    # the node's only free GPUs: a whole-GPU pod there takes one of them
    time.sleep(1.2)  # past the search's redraw
    before = {
        g["index"]: _pixel(browser, target, g["index"])
        for g in (cache.node_summary(target) or {"gpus": []})["gpus"]
    }
    assert _near(before[gpu], FREE)
    updates = browser.evaluate("tessera.updates")
    assert cluster.bind("late-1", {GPU: "100"}, [target]) == target
    bound = time.monotonic()
    (alloc,) = [a for a in cache.snapshot().allocations.values() if a.name == "late-1"]
    (grant,) = alloc.containers[0].gpus
    wait_for(lambda: _near(_pixel(browser, target, grant.index), FULL), timeout=20, interval=0.02)
    print(f"recoloured {1000 * (time.monotonic() - bound):.0f} ms after the bind returned")
    assert browser.evaluate("tessera.updates") > updates  # drawn from the stream
    assert _near(before[grant.index], FREE)


def test_why_pending_lists_refused_pods_with_the_nearest_fit(
    big: tuple[PageCluster, Browser],
) -> None:
    """Also writes the page's screenshot for the docs when TESSERA_SCREENSHOT_DIR is set
    (README.md and docs/kubectl-tessera.md show docs/images/allocation-page.png)."""
    cluster, browser = big
    service = cluster.service
    assert cluster.bind("too-big", {GPU: "1600"}, cluster.names) is None
    assert cluster.bind("eight-gpus", {GPU: "800"}, cluster.names) is None
    want = service.views.pending()["pods"]
    assert [p["pod"] for p in want] == ["default/eight-gpus", "default/too-big"]
    near = want[0]["explain"]["nearest"]
    assert near and near[0]["reason"].startswith("needs 8 whole GPUs, ")
    assert not want[1]["explain"]["nearest"]  # no node has 16 GPUs: waiting will not help
    browser.evaluate("drawPending()")
    table = wait_for(
        lambda: "default/too-big" in (t := browser.evaluate('$("pending").innerText')) and t, 20
    )
    assert f"{near[0]['node']}: {near[0]['reason']}" in table
    assert "no node can take it by waiting" in table
    assert "8 whole GPUs" in table and "16 whole GPUs" in table
    browser.evaluate(f"select({json.dumps(near[0]['node'])})")
    wait_for(
        lambda: browser.evaluate(
            f"!!document.querySelector('.node[data-node=\"{near[0]['node']}\"]')"
        ),
        20,
    )
    where = os.environ.get("TESSERA_SCREENSHOT_DIR")
    if where:
        from PIL import Image

        png = browser.screenshot(full_page=True)
        image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256)
        image.save(Path(where) / "allocation-page.png", optimize=True)
