"""The allocation page at 5,000 nodes x 8 GPUs (half full), in headless Chromium on this
machine (bench/ui_page.py):

- first paint: from navigation to the canvas holding every node, as the page records it;
  the median of several loads in one browser (its first load, with a cold browser, is in
  the note);
- update after a bind: from the bind's answer to the granted GPU's cell drawn in its new
  colour (read from the canvas), the median of several binds;
- the scheduler's CPU for serving one open page: the CPU of its HTTP threads (event loop,
  debug/verb pool, watch pool) over a minute with the page open, less the same minute
  without it, while 500 heartbeat Leases a second are renewed (5,000 agents every 10 s)
  and a pod is bound every second in both, in percent of one core.
"""

from __future__ import annotations

import statistics
import threading
import time

from bench.common import BenchContext, Result
from bench.ui_page import GPU_LIMIT, PageCluster, chromium, open_page, page_cluster, thread_cpu
from tessera_testbed.browser import CHROMIUM, Browser, wait_for
from tessera_testbed.inventory import heartbeat_lease

SERVING_THREADS = ("http-extender", "verb", "watch")
FULL = (11, 61, 117)


def _pixel(browser: Browser, node: str, gpu: int) -> tuple[int, ...]:
    value = browser.evaluate(
        f"""(() => {{ const c = tessera.cellAt("{node}", {gpu}), d = devicePixelRatio;
        const p = document.getElementById("cells").getContext("2d").getImageData(
          Math.floor((c.x + c.w / 2) * d), Math.floor((c.y + c.h / 2) * d), 1, 1).data;
        return [p[0], p[1], p[2]]; }})()"""
    )
    return tuple(value)


def _free_gpus(cluster: PageCluster, count: int) -> list[str]:
    """Nodes with a whole GPU free (one bind each)."""
    cache = cluster.service.cache
    problems = cache.problems.by_node()
    found = []
    for name in cluster.names[::7]:
        view = cache.node_summary(name)
        if name in problems or view is None:
            continue
        if any(g["core"]["used"] == 0 and g["memoryMiB"]["used"] == 0 for g in view["gpus"]):
            found.append(name)
        if len(found) == count:
            break
    return found


def _recolour_ms(cluster: PageCluster, browser: Browser, binds: int) -> list[float]:
    cache = cluster.service.cache
    out = []
    for i, node in enumerate(_free_gpus(cluster, binds)):
        name = f"bench-ui-{i}"
        assert cluster.bind(name, GPU_LIMIT, [node]) == node
        answered = time.perf_counter()
        (alloc,) = [a for a in cache.snapshot().allocations.values() if a.name == name]
        gpu = alloc.containers[0].gpus[0].index

        def drawn(node: str = node, gpu: int = gpu) -> bool:
            got = _pixel(browser, node, gpu)
            return max(abs(a - b) for a, b in zip(got, FULL, strict=True)) <= 2

        wait_for(drawn, timeout=30, interval=0.005)
        out.append(1000 * (time.perf_counter() - answered))
    return out


def _serving_cpu(cluster: PageCluster, seconds: float) -> float:
    """CPU seconds of the serving threads over `seconds` of renewals and binds."""
    cache = cluster.service.cache
    stop = threading.Event()

    def renew() -> None:
        k = 0
        while not stop.is_set():
            start = time.perf_counter()
            for name in cluster.names[k % 10 :: 10][:500]:
                cache.leases.seen(heartbeat_lease(name))
            k += 1
            stop.wait(max(0.0, 1.0 - (time.perf_counter() - start)))

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    nodes = _free_gpus(cluster, int(seconds))
    before = thread_cpu(SERVING_THREADS)
    started = time.monotonic()
    for i, node in enumerate(nodes):
        cluster.bind(f"bench-cpu-{time.monotonic_ns()}-{i}", GPU_LIMIT, [node])
        time.sleep(max(0.0, started + i + 1 - time.monotonic()))
    used = thread_cpu(SERVING_THREADS) - before
    stop.set()
    renewer.join()
    return used / (time.monotonic() - started)


def run(ctx: BenchContext) -> list[Result]:
    if not CHROMIUM:
        print("   skipped: no chromium (apt-get install chromium)")
        return []
    nodes = ctx.sized(500, 5000)
    loads = ctx.sized(2, 5)
    binds = ctx.sized(3, 10)
    window = ctx.sized(10.0, 60.0)
    with page_cluster(nodes) as cluster, chromium() as browser:
        cold = open_page(browser, cluster.url)
        paints = []
        for i in range(loads):
            browser.call("Page.navigate", url="about:blank")
            time.sleep(0.5)
            paints.append(open_page(browser, f"{cluster.url}#load{i}"))
        time.sleep(2)
        recolour = _recolour_ms(cluster, browser, binds)
        with_page = _serving_cpu(cluster, window)
        browser.call("Page.navigate", url="about:blank")
        time.sleep(2)
        without = _serving_cpu(cluster, window)
    page_cpu = max(0.0, with_page - without) * 100
    return [
        Result(
            f"allocation page first paint, {nodes} nodes x 8 GPUs (median of {loads} loads)",
            statistics.median(paints),
            "ms",
            1000,
            note=f"the first load, in a browser just started: {cold:.0f} ms; "
            f"all loads: {', '.join(f'{p:.0f}' for p in paints)} ms",
        ),
        Result(
            f"allocation page: a bind's GPU recoloured after the bind answered (median of {binds})",
            statistics.median(recolour),
            "ms",
            1000,
            note=f"slowest {max(recolour):.0f} ms",
        ),
        Result(
            f"scheduler CPU serving one open allocation page, {nodes} nodes "
            "(500 Lease renewals/s, 1 bind/s)",
            page_cpu,
            "% of a core",
            5,
            note=f"serving threads {100 * with_page:.1f}% of a core with the page open, "
            f"{100 * without:.1f}% without it",
        ),
    ]
