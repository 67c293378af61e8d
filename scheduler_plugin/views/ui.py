"""The live allocation page (`GET /debug/ui`): the whole cluster on one screen.

It opens on the figures per GPU model (allocated, free, what still fits) and one canvas
cell per GPU, grouped by node and coloured by allocation, with the nodes that take no new
pods marked; a search (node, pod, namespace, GPU UUID, model), a click on a node for its
GPUs and NICs and who holds what (with what each container uses beside its grant), sorting
and filtering of the nodes, the gangs that wait (members against minMember, the reason,
the reservation), and the pods tessera refused with the reason and the nearest fit (a gang
member instead names its gang). On a cluster of a few nodes every node's details are shown at once.

The page is a fixed shell and a script (`ui.js`, beside this module, served at
`/debug/ui.js`), neither with any cluster data in it and neither loading anything from
elsewhere; everything it shows comes from the debug API (`/debug/watch?view=overview`,
`/debug/nodes/<node>`, `/debug/search`, `/debug/pending`), which the browser calls with
the caller's credentials (the TLS client certificate, or a bearer token given in the URL
fragment as `#token=...`, which browsers never send to the server). It only reads. The
script only draws: every figure comes computed from the scheduler (scheduler_plugin.views.overview,
tessera.capacity, tessera.explain).
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

PAGE_PATH = "/debug/ui"
SCRIPT_PATH = "/debug/ui.js"


@cache
def script() -> bytes:
    return files(__package__ or "scheduler_plugin.views").joinpath("ui.js").read_bytes()


PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tessera: GPU allocation</title>
<style>
  :root { --ink: #1b1f24; --muted: #57606a; --line: #d0d7de; --bg: #f6f7f9; --card: #fff;
          --warn: #bc4c00; --bad: #cf222e; }
  * { box-sizing: border-box; }
  body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
         background: var(--bg); color: var(--ink); }
  header { display: flex; align-items: baseline; gap: 16px; padding: 10px 16px;
           background: var(--card); border-bottom: 1px solid var(--line); }
  h1 { font-size: 16px; margin: 0; }
  h2 { font-size: 14px; margin: 0 0 6px; }
  #status { color: var(--muted); }
  #status.error { color: var(--bad); }
  main { padding: 12px 16px; }
  section { background: var(--card); border: 1px solid var(--line); border-radius: 6px;
            padding: 10px 12px; margin-bottom: 12px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eaeef2;
           vertical-align: top; }
  th { font-weight: 600; color: var(--muted); font-size: 12px; white-space: nowrap; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  .meter { display: inline-block; width: 80px; height: 8px; background: #eaeef2;
           border-radius: 4px; vertical-align: middle; margin-right: 6px; overflow: hidden; }
  .meter > span { display: block; height: 100%; background: #2f6fb3; }
  .sub { color: var(--muted); font-size: 12px; }
  #toolbar { display: flex; flex-wrap: wrap; align-items: center; gap: 10px 18px;
             margin-bottom: 8px; }
  #toolbar label { color: var(--muted); }
  input, select { font: inherit; padding: 3px 6px; border: 1px solid var(--line);
                  border-radius: 4px; background: #fff; }
  #search { width: 280px; }
  #legend { display: flex; flex-wrap: wrap; gap: 12px; color: var(--muted); font-size: 12px; }
  #legend i { display: inline-block; width: 11px; height: 11px; margin-right: 4px;
              vertical-align: -1px; border-radius: 2px; }
  #map { position: relative; }
  canvas { display: block; cursor: pointer; }
  #tip { position: absolute; pointer-events: none; background: #24292f; color: #fff;
         padding: 4px 7px; border-radius: 4px; font-size: 12px; white-space: pre;
         display: none; z-index: 2; }
  #below { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 12px;
           align-items: start; }
  @media (max-width: 1100px) { #below { grid-template-columns: minmax(0, 1fr); } }
  #matches li, #problems li { cursor: pointer; }
  ul { margin: 4px 0; padding-left: 18px; }
  .problem { color: var(--bad); font-size: 12px; margin-bottom: 4px; }
  .warn { color: var(--warn); }
  .bad { color: var(--bad); }
  #nodes { display: flex; flex-wrap: wrap; gap: 12px; }
  .node { background: #fff; border: 1px solid var(--line); border-radius: 6px;
          padding: 8px 10px; width: 420px; }
  .node.unusable { border-color: var(--bad); }
  .node h3 { font-size: 14px; margin: 0 0 6px; }
  .gpu { margin: 4px 0; }
  .label { font-size: 12px; color: var(--muted); }
  .bar { position: relative; height: 18px; background: #eaeef2; border-radius: 3px;
         overflow: hidden; display: flex; }
  .share { height: 100%; color: #fff; font-size: 11px; line-height: 18px; overflow: hidden;
           white-space: nowrap; text-overflow: ellipsis; padding: 0 3px;
           border-right: 1px solid #fff; }
  .unhealthy .bar { outline: 2px solid var(--bad); }
  .use { font-size: 12px; margin: 1px 0 0 8px; }
  .use.other { color: #9a6700; }
  #pending td { font-size: 12px; }
  #pending caption { text-align: left; font-weight: 600; padding: 6px 0 2px; }
  .empty { color: var(--muted); }
</style>
</head>
<body>
<header><h1>tessera: GPU allocation</h1><div id="status">loading...</div></header>
<main>
<section id="overview"><h2>By GPU model</h2><table id="models"></table></section>
<section>
  <div id="toolbar">
    <span><label for="search">Find</label>
      <input id="search" type="search" placeholder="node, pod, namespace, GPU UUID or model">
      <span id="found" class="sub"></span></span>
    <span><label for="sort">Sort</label> <select id="sort">
      <option value="name">by name</option><option value="most">most allocated first</option>
      <option value="least">least allocated first</option><option value="model">by model</option>
      <option value="problem">problems first</option></select></span>
    <span><label for="filter">Show</label> <select id="filter"></select></span>
  </div>
  <div id="legend"></div>
  <div id="map"><canvas id="cells"></canvas><div id="tip"></div></div>
</section>
<section><h2>Why pending</h2><div id="pending" class="empty">-</div></section>
<div id="below">
  <section><h2 id="detail-title">Node</h2><ul id="matches"></ul><div id="nodes"></div></section>
  <section><h2>Nodes that take no new pods</h2><ul id="problems"></ul></section>
</div>
</main>
<script src="/debug/ui.js"></script>
</body>
</html>
"""
