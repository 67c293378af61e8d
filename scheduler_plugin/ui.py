"""The live allocation page (`GET /debug/ui`): every node's GPUs and RDMA devices, which
pod holds what share, and beside each grant what its container uses (memory, SM %) as the
node agent last read it, with what no tessera container owns on each GPU on lines of its
own; redrawn as the scheduler's state and the readings change.

The page is a fixed shell with no cluster data in it; everything it shows comes from
`/debug/nodes` and the `/debug/watch` stream, which the browser calls with the caller's
credentials (the TLS client certificate, or a bearer token given in the URL fragment as
`#token=...`, which browsers never send to the server). It only reads.
"""

from __future__ import annotations

PAGE_PATH = "/debug/ui"

PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tessera: GPU allocation</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 16px; background: #f6f7f9; color: #1b1f24; }
  h1 { font-size: 18px; margin: 0 0 4px; }
  #status { color: #57606a; margin-bottom: 12px; }
  #nodes { display: flex; flex-wrap: wrap; gap: 12px; }
  .node { background: #fff; border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 10px;
          width: 420px; }
  .node.unusable { border-color: #cf222e; }
  .node h2 { font-size: 15px; margin: 0 0 6px; }
  .problem { color: #cf222e; font-size: 12px; margin-bottom: 4px; }
  .gpu { margin: 4px 0; }
  .label { font-size: 12px; color: #57606a; }
  .bar { position: relative; height: 18px; background: #eaeef2; border-radius: 3px;
         overflow: hidden; display: flex; }
  .share { height: 100%; color: #fff; font-size: 11px; line-height: 18px; overflow: hidden;
           white-space: nowrap; text-overflow: ellipsis; padding: 0 3px; box-sizing: border-box;
           border-right: 1px solid #fff; }
  .unhealthy .bar { outline: 2px solid #cf222e; }
  .use { font-size: 12px; margin: 1px 0 0 8px; }
  .use.other { color: #9a6700; }
</style>
</head>
<body>
<h1>tessera: GPU allocation</h1>
<div id="status">loading...</div>
<div id="nodes"></div>
<script>
"use strict";
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
const nodes = new Map();
const colors = ["#0969da", "#1a7f37", "#8250df", "#bf3989", "#9a6700", "#0a7f8c", "#bc4c00"];
function color(key) {
  let h = 0;
  for (const ch of key) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return colors[h % colors.length];
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function gib(mib) { return (mib / 1024).toFixed(1) + " GiB"; }
function pct(v) { return v === null || v === undefined ? "-" : v + "%"; }
// used beside granted: "-" where the node's reading is unknown (n.usage says why)
function used(u) { return u ? gib(u.memoryMiB) + ", SM " + pct(u.smPercent) : "-"; }
function drawUse(row, g) {
  for (const p of g.pods) {
    row.appendChild(el("div", "use", p.namespace + "/" + p.name + " (" + p.container +
      "): granted " + p.core + "%, " + gib(p.memoryMiB) + "; used " + used(p.usage)));
  }
  // never under a pod: processes of no tessera container, and tessera containers the
  // scheduler holds no grant for on this GPU
  for (const o of g.unattributed || []) {
    row.appendChild(el("div", "use other", "not tessera: " + o.owner + " " +
      gib(o.memoryMiB) + " (" + o.processes + " processes)"));
  }
  for (const u of g.ungranted || []) {
    row.appendChild(el("div", "use other", "no grant here: " + u.namespace + "/" + u.name +
      " (" + u.container + ") " + used(u)));
  }
}
function usageLine(n) {
  const u = n.usage;
  if (!u) return el("div", "label", "use: -");
  if (!u.known) return el("div", u.invalid ? "problem" : "label", "use: - (" + u.reason + ")");
  return el("div", "label", "use read " + u.observed +
    (u.elsewhere ? " (" + u.elsewhere + " rows on GPUs not in the inventory)" : ""));
}
function drawNode(n) {
  const box = el("div", "node" + (n.usable ? "" : " unusable"));
  box.dataset.node = n.node;
  box.appendChild(el("h2", "", n.node));
  if (n.problem) box.appendChild(el("div", "problem", n.problem));
  for (const f of n.fenced || []) box.appendChild(el("div", "problem", "fenced: " + f.problem));
  box.appendChild(usageLine(n));
  for (const g of n.gpus) {
    const row = el("div", "gpu" + (g.healthy ? "" : " unhealthy"));
    row.dataset.gpu = g.uuid;
    row.appendChild(el("div", "label",
      "GPU " + g.index + " " + g.model + ": " + g.core.used + "% compute, " +
      gib(g.memoryMiB.used) + " of " + gib(g.memoryMiB.total) + " granted; in use " +
      (g.inUse ? gib(g.inUse.memoryMiB) : "-") + (g.healthy ? "" : " (unhealthy)")));
    const bar = el("div", "bar");
    for (const p of g.pods) {
      const who = p.namespace + "/" + p.name;
      const s = el("div", "share", who + " " + p.core + "%");
      s.dataset.pod = who;
      s.title = who + " (" + p.container + "): " + p.core + "% compute, " + gib(p.memoryMiB) +
        "; used " + used(p.usage);
      s.style.width = Math.max(p.core, 1) + "%";
      s.style.background = color(who);
      bar.appendChild(s);
    }
    row.appendChild(bar);
    drawUse(row, g);
    box.appendChild(row);
  }
  for (const r of n.rdma) {
    const who = r.pods.map(p => p.namespace + "/" + p.name).join(", ");
    box.appendChild(el("div", "label", "RDMA " + r.ibdev + ": " + r.share.used + "% used, " +
      (r.vfs.total - r.vfs.free) + "/" + r.vfs.total + " VFs" + (who ? " (" + who + ")" : "")));
  }
  return box;
}
function render() {
  const root = document.getElementById("nodes");
  root.replaceChildren(...[...nodes.keys()].sort().map(k => drawNode(nodes.get(k))));
  let gpus = 0, used = 0;
  for (const n of nodes.values()) for (const g of n.gpus) { gpus += 1; used += g.core.used; }
  document.getElementById("status").textContent = nodes.size + " nodes, " + gpus + " GPUs, " +
    (gpus ? (used / gpus).toFixed(1) : "0") + "% of GPU compute allocated; updated " +
    new Date().toLocaleTimeString();
}
// readings change every node every ~10 s: redraw at most twice a second, not per event
let pending = null;
function scheduleRender() {
  if (pending === null) pending = setTimeout(() => { pending = null; render(); }, 500);
}
async function load() {
  const answer = await fetch("/debug/nodes", { headers });
  if (!answer.ok) throw new Error("/debug/nodes: " + answer.status + " " + await answer.text());
  nodes.clear();
  for (const n of (await answer.json()).nodes) nodes.set(n.node, n);
  render();
}
async function watch() {
  const answer = await fetch("/debug/watch", { headers });
  if (!answer.ok) throw new Error("/debug/watch: " + answer.status);
  const reader = answer.body.getReader();
  const text = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += text.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\\n")) >= 0) {
      const event = JSON.parse(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 1);
      if (event.type === "MODIFIED") nodes.set(event.node.node, event.node);
      else if (event.type === "DELETED") nodes.delete(event.node.node);
      else continue;
      scheduleRender();
    }
  }
}
async function run() {
  for (;;) {
    try {
      await load();
      await watch();
    } catch (err) {
      document.getElementById("status").textContent = "error: " + err.message + "; retrying";
    }
    await new Promise(done => setTimeout(done, 2000));
  }
}
run();
</script>
</body>
</html>
"""
