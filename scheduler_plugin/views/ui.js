// tessera's allocation page (scheduler_plugin/views/ui.py says what it shows). It only draws:
// every figure comes computed from the scheduler's debug API.
"use strict";
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const headers = token ? { Authorization: "Bearer " + token } : {};
const $ = id => document.getElementById(id);
const SMALL = 16; // up to this many nodes, every node's details are shown
const FREE = "#dcebdd", PART = "#8cbfe0", MOST = "#3a7fc0", FULL = "#0b3d75";
const CLOSED = "#c9ccd1", SICK = "#cf222e", FENCE = "#cf222e", NOTREADY = "#bc4c00";
const rows = new Map();     // node -> its row (scheduler_plugin/views/overview.py)
let models = [], order = [], layout = null, query = null, selected = null;
const details = new Map();  // node -> its /debug/nodes/<node> view, for the shown nodes
window.tessera = { firstPaint: null, updates: 0, cellAt };

// --- helpers ---------------------------------------------------------------------------
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
const num = n => n.toLocaleString("en-US");
const gib = mib => (mib / 1024).toFixed(1) + " GiB";
function bytes(mib) {
  if (mib >= 1024 ** 3) return (mib / 1024 ** 3).toFixed(2) + " PiB";
  return mib >= 1024 ** 2 ? (mib / 1024 ** 2).toFixed(1) + " TiB" : gib(mib);
}
const pct = v => (v === null || v === undefined ? "-" : v + "%");
async function getJson(path) {
  const answer = await fetch(path, { headers });
  if (!answer.ok) throw new Error(path + ": " + answer.status + " " + await answer.text());
  return answer.json();
}
function setStatus(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}
const gpuCount = r => r.c.length;
const modelOf = (r, i) => (Array.isArray(r.m) ? r.m[i] : r.m);
const taken = (r, i) => Math.max(r.c[i], r.g[i]); // the GPU's scarcer side, in percent
function allocated(r) {
  let sum = 0;
  for (let i = 0; i < r.c.length; i++) sum += taken(r, i);
  return r.c.length ? sum / r.c.length : 0;
}
function cellColor(r, i) {
  if (r.h & (1 << i)) return SICK;
  const t = taken(r, i);
  if (t === 0) return r.p ? CLOSED : FREE;
  return t >= 100 ? FULL : t >= 50 ? MOST : PART;
}

// --- the figures per model ---------------------------------------------------------------
function meter(used, total) {
  const share = total ? (100 * used) / total : 0;
  const td = el("td", "num");
  const m = el("span", "meter");
  const fill = el("span");
  fill.style.width = share.toFixed(1) + "%";
  m.appendChild(fill);
  td.append(m, share.toFixed(1) + "%");
  return td;
}
// a header row: each title a text, or [text, class]
function headRow(titles) {
  const head = el("tr");
  for (const t of titles) {
    const [text, cls] = Array.isArray(t) ? t : [t];
    head.appendChild(el("th", cls, text));
  }
  return head;
}
// a table with its caption and header row
function captioned(caption, titles) {
  const table = el("table");
  table.append(el("caption", "", caption), headRow(titles));
  return table;
}
function drawModels() {
  const table = $("models");
  const head = headRow([["GPU model"], ["Nodes", "num"], ["GPUs", "num"],
    ["Compute allocated", "num"], ["Memory allocated", "num"], ["Whole GPUs free", "num"],
    ["Whole GPUs placeable now", "num"], ["Largest share that fits now"]]);
  const body = [head];
  for (const m of models) {
    const tr = el("tr");
    tr.dataset.model = m.model;
    const cell = (k, text, cls) => { const td = el("td", cls, text); td.dataset.k = k; return td; };
    const gpus = cell("gpus", num(m.gpus), "num");
    if (m.unhealthy) gpus.appendChild(el("div", "sub warn", num(m.unhealthy) + " unhealthy"));
    const core = meter(m.coreUsed, m.gpus * 100);
    core.dataset.k = "core";
    core.appendChild(el("div", "sub", num(Math.round(m.coreUsed / 100)) + " of " + num(m.gpus) +
      " GPUs' compute"));
    const mem = meter(m.memoryUsedMiB, m.memoryTotalMiB);
    mem.dataset.k = "memory";
    mem.appendChild(el("div", "sub", bytes(m.memoryUsedMiB) + " of " + bytes(m.memoryTotalMiB)));
    const place = cell("placeable", num(m.wholePlaceable), "num");
    place.appendChild(el("div", "sub", m.wholePlaceable ? "up to " + m.mostWholeOnOneNode +
      " on one node" : "none"));
    const share = cell("share", "");
    if (!m.shares.length) share.textContent = "nothing fits";
    else {
      const top = m.shares[0], roomy = m.shares[m.shares.length - 1];
      share.textContent = top.core + "% compute with " + gib(top.memoryMiB);
      if (m.shares.length > 1) {
        share.appendChild(el("div", "sub", "or " + gib(roomy.memoryMiB) + " with " +
          roomy.core + "% compute"));
      }
    }
    tr.append(cell("model", m.model), cell("nodes", num(m.nodes), "num"), gpus, core, mem,
      cell("free", num(m.wholeFree), "num"), place, share);
    body.push(tr);
  }
  if (!models.length) body.push(el("tr", "empty", "no GPUs known"));
  table.replaceChildren(...body);
}

// --- the canvas --------------------------------------------------------------------------
function drawLegend() {
  const items = [[FREE, "free"], [PART, "1-49% allocated"], [MOST, "50-99%"], [FULL, "full"],
    [SICK, "unhealthy GPU"], [CLOSED, "free, node takes no pods"]];
  const parts = items.map(([c, t]) => { const s = el("span"); const i = el("i");
    i.style.background = c; s.append(i, t); return s; });
  const ring = (c, t) => { const s = el("span"); const i = el("i");
    i.style.border = "2px solid " + c; s.append(i, t); return s; };
  parts.push(ring(NOTREADY, "node not ready"), ring(FENCE, "node fenced"));
  parts.push(el("span", "", "colour: the larger of compute and memory granted, per GPU"));
  $("legend").replaceChildren(...parts);
}
function visible(r) {
  const f = $("filter").value;
  if (f === "problem") return !!r.p;
  if (f === "free") return !r.p && r.c.some((c, i) => taken(r, i) === 0 && !(r.h & (1 << i)));
  if (f === "full") return r.c.length > 0 && r.c.every((c, i) => taken(r, i) >= 100);
  if (f.startsWith("model:")) return r.c.some((c, i) => modelOf(r, i) === f.slice(6));
  return true;
}
function sortOrder() {
  const how = $("sort").value;
  const list = [...rows.values()].filter(visible);
  const byName = (a, b) => (a.n < b.n ? -1 : a.n > b.n ? 1 : 0);
  const keyed = {
    most: (a, b) => allocated(b) - allocated(a) || byName(a, b),
    least: (a, b) => allocated(a) - allocated(b) || byName(a, b),
    model: (a, b) => String(a.m).localeCompare(String(b.m)) || byName(a, b),
    problem: (a, b) => (b.p ? 1 : 0) - (a.p ? 1 : 0) || byName(a, b),
  };
  list.sort(keyed[how] || byName);
  return list.map(r => r.n);
}
function makeLayout() {
  const canvas = $("cells");
  const width = $("map").clientWidth;
  let most = 1;
  for (const r of rows.values()) most = Math.max(most, gpuCount(r));
  const br = most <= 4 ? 1 : most <= 16 ? 2 : 4, bc = Math.ceil(most / br);
  const n = Math.max(order.length, 1);
  const budget = Math.max(240, window.innerHeight * 0.55);
  let L = null;
  for (let s = 22; s >= 2; s--) {
    const gap = s >= 6 ? 1 : 0, pad = Math.max(3, Math.round(s * 0.6));
    const bw = bc * s + (bc - 1) * gap + pad, bh = br * s + (br - 1) * gap + pad;
    const perRow = Math.max(1, Math.floor((width + pad) / bw));
    const height = Math.ceil(n / perRow) * bh;
    L = { s, gap, pad, bw, bh, br, bc, perRow, height, width, at: new Map() };
    if (height <= budget) break;
  }
  order.forEach((name, k) => L.at.set(name, k));
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(L.height * dpr);
  canvas.style.width = width + "px";
  canvas.style.height = L.height + "px";
  canvas.getContext("2d").setTransform(dpr, 0, 0, dpr, 0, 0);
  return L;
}
function origin(k) {
  return [(k % layout.perRow) * layout.bw + layout.pad / 2,
    Math.floor(k / layout.perRow) * layout.bh + layout.pad / 2];
}
function cellAt(node, gpu) { // where a GPU's cell is drawn, in CSS pixels (tests read it)
  const k = layout && layout.at.get(node);
  if (k === undefined) return null;
  const [x, y] = origin(k);
  const { s, gap, bc } = layout;
  return { x: x + (gpu % bc) * (s + gap), y: y + Math.floor(gpu / bc) * (s + gap), w: s, h: s };
}
function drawNodeCells(ctx, name) {
  const k = layout.at.get(name), r = rows.get(name);
  if (k === undefined) return;
  const [x, y] = origin(k);
  const { s, gap, bc, br, pad } = layout;
  const w = bc * s + (bc - 1) * gap, h = br * s + (br - 1) * gap;
  const m = Math.floor(pad / 2);
  ctx.clearRect(x - m, y - m, w + 2 * m, h + 2 * m);
  if (!r) return;
  const hits = query && query.nodes[name];
  const dim = query && !hits;
  ctx.globalAlpha = dim ? 0.18 : 1;
  if (r.p) { // the node takes no new pods: a ring in the gap around its cells
    ctx.fillStyle = r.f ? FENCE : NOTREADY;
    ctx.fillRect(x - m, y - m, w + 2 * m, h + 2 * m);
    ctx.clearRect(x, y, w, h);
  }
  for (let i = 0; i < gpuCount(r); i++) {
    const cx = x + (i % bc) * (s + gap), cy = y + Math.floor(i / bc) * (s + gap);
    ctx.fillStyle = cellColor(r, i);
    ctx.fillRect(cx, cy, s, s);
    if (hits && hits.includes(i)) {
      ctx.strokeStyle = "#f0b400";
      ctx.lineWidth = Math.max(1, s / 4);
      ctx.strokeRect(cx + 0.5, cy + 0.5, s - 1, s - 1);
    }
  }
  if (!gpuCount(r)) { ctx.fillStyle = CLOSED; ctx.fillRect(x, y, w, h); }
  if (hits && !hits.length && s >= 3) { // the node itself matched
    ctx.strokeStyle = "#f0b400"; ctx.lineWidth = 2; ctx.strokeRect(x - 1, y - 1, w + 2, h + 2);
  }
  if (name === selected) {
    ctx.globalAlpha = 1; ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
    ctx.strokeRect(x - 1.5, y - 1.5, w + 3, h + 3);
  }
  ctx.globalAlpha = 1;
}
function drawAll() {
  order = sortOrder();
  layout = makeLayout();
  const ctx = $("cells").getContext("2d");
  for (const name of order) drawNodeCells(ctx, name);
  if (window.tessera.firstPaint === null && rows.size) {
    window.tessera.firstPaint = performance.now();
  }
}
function nodeAt(event) {
  if (!layout) return null;
  const box = $("cells").getBoundingClientRect();
  const x = event.clientX - box.left, y = event.clientY - box.top;
  const col = Math.floor(x / layout.bw), row = Math.floor(y / layout.bh);
  if (col >= layout.perRow) return null;
  const name = order[row * layout.perRow + col];
  if (name === undefined) return null;
  const [ox, oy] = origin(row * layout.perRow + col);
  const { s, gap, bc } = layout;
  const gx = Math.floor((x - ox) / (s + gap)), gy = Math.floor((y - oy) / (s + gap));
  const gpu = gx >= 0 && gx < bc && gy >= 0 ? gy * bc + gx : -1;
  return { name, gpu };
}
function tip(event) {
  const at = nodeAt(event), box = $("tip");
  const r = at && rows.get(at.name);
  if (!r) { box.style.display = "none"; return; }
  let text = r.n + "  (" + r.k + " pods)";
  if (at.gpu >= 0 && at.gpu < gpuCount(r)) {
    text += "\nGPU " + at.gpu + " " + modelOf(r, at.gpu) + ": " + r.c[at.gpu] +
      "% compute, " + r.g[at.gpu] + "% memory granted" +
      (r.h & (1 << at.gpu) ? " (unhealthy)" : "");
  }
  if (r.p) text += "\n" + (r.f ? "fenced: " : "takes no new pods: ") + r.p.slice(0, 160);
  box.textContent = text;
  const host = $("map").getBoundingClientRect();
  box.style.left = Math.min(event.clientX - host.left + 14, host.width - 360) + "px";
  box.style.top = event.clientY - host.top + 14 + "px";
  box.style.display = "block";
}

// --- a node's details (GPUs, NICs, who holds what, use beside grants) ---------------------
const colors = ["#0969da", "#1a7f37", "#8250df", "#bf3989", "#9a6700", "#0a7f8c", "#bc4c00"];
function color(key) {
  let h = 0;
  for (const ch of key) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return colors[h % colors.length];
}
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
  box.appendChild(el("h3", "", n.node));
  if (n.problem) box.appendChild(el("div", "problem", n.problem));
  for (const f of n.fenced || []) box.appendChild(el("div", "problem", "fenced: " + f.problem));
  box.appendChild(usageLine(n));
  for (const g of n.gpus) {
    const row = el("div", "gpu" + (g.healthy ? "" : " unhealthy"));
    row.dataset.gpu = g.uuid;
    row.appendChild(el("div", "label",
      "GPU " + g.index + " " + g.model + " " + g.uuid + ": " + g.core.used + "% compute, " +
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
function shown() {
  if (rows.size <= SMALL) return [...rows.keys()].sort();
  return selected ? [selected] : [];
}
async function refreshDetails(names) {
  const want = new Set(shown());
  for (const name of details.keys()) if (!want.has(name)) details.delete(name);
  await Promise.all(names.filter(n => want.has(n)).map(async name => {
    try { details.set(name, await getJson("/debug/nodes/" + encodeURIComponent(name))); }
    catch (err) { details.delete(name); }
  }));
  const cards = [...want].filter(n => details.has(n)).map(n => drawNode(details.get(n)));
  $("nodes").replaceChildren(...cards);
  $("detail-title").textContent = rows.size <= SMALL ? "Nodes" :
    selected ? "Node " + selected : "Node (click a cell, or find one)";
}
function select(name) {
  const before = selected;
  selected = name;
  const ctx = $("cells").getContext("2d");
  for (const n of [before, name]) if (n) drawNodeCells(ctx, n);
  refreshDetails([name]);
}

// --- search, problems, pending -------------------------------------------------------------
let searchTimer = null;
function onSearch() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(async () => {
    const q = $("search").value.trim();
    if (!q) { query = null; $("found").textContent = ""; $("matches").replaceChildren(); }
    else {
      try { query = await getJson("/debug/search?q=" + encodeURIComponent(q)); }
      catch (err) { $("found").textContent = err.message; return; }
      const nodes = Object.keys(query.nodes).length;
      $("found").textContent = num(query.total) + " matches on " + num(nodes) + " nodes";
      const items = query.matches.slice(0, 30).map(m => {
        const text = m.kind === "pod" ? "pod " + m.pod + " on " + m.node +
            (m.gpus.length ? " (GPU " + m.gpus.join(", ") + ")" : "") :
          m.kind === "gpu" ? "GPU " + m.uuid + " (" + m.node + " GPU " + m.gpu + ")" :
          m.kind === "model" ? "model " + m.model + " (" + num(m.nodes) + " nodes)" :
          "node " + m.node;
        const li = el("li", "", text);
        if (m.node) li.onclick = () => select(m.node);
        return li;
      });
      $("matches").replaceChildren(...items);
      if (nodes === 1) select(Object.keys(query.nodes)[0]);
    }
    drawAll();
  }, 150);
}
function drawProblems() {
  const bad = [...rows.values()].filter(r => r.p).sort((a, b) => (a.n < b.n ? -1 : 1));
  const items = bad.slice(0, 50).map(r => {
    const li = el("li");
    li.append(el("b", r.f ? "bad" : "warn", r.n), " " + r.p);
    li.onclick = () => select(r.n);
    return li;
  });
  if (bad.length > 50) items.push(el("li", "sub", "and " + num(bad.length - 50) + " more"));
  if (!bad.length) items.push(el("li", "empty", "none: every node takes new pods"));
  $("problems").replaceChildren(...items);
}
function ago(s) {
  return s < 120 ? s + " s" : s < 7200 ? Math.round(s / 60) + " min" : Math.round(s / 3600) + " h";
}
async function drawPending() {
  let answer;
  try { answer = await getJson("/debug/pending"); } catch (err) { return; }
  const box = $("pending");
  const gangs = answer.gangs || [];
  if (!answer.pods.length && !gangs.length) {
    box.className = "empty";
    box.textContent = "none: tessera refused no pod in the last " + ago(answer.ttlS) +
      ", and no gang waits";
    return;
  }
  box.className = "";
  const parts = [];
  if (gangs.length) parts.push(gangTable(gangs, answer.gangsWaiting));
  if (answer.pods.length) parts.push(podTable(answer.pods));
  box.replaceChildren(...parts);
}
function gangTable(gangs, total) {
  const table = captioned("Gangs: each placed whole or not at all", ["Gang", "Namespace",
    "Members", "Waiting because", "Reservation", "Pending members"]);
  table.id = "gangs";
  for (const g of gangs) {
    const tr = el("tr");
    tr.dataset.gang = g.gang;
    const want = g.minMember === null ? "no usable PodGroup" : "minMember " + num(g.minMember);
    const r = g.reservation;
    const held = r.state === "reserved" ? "reserved on " + r.nodes.join(", ") + ", " +
        Math.round(r.seconds) + " s left" :
      r.state === "released" ? "released, planned again in " + Math.round(r.seconds) + " s" :
      "none";
    const names = g.pendingMembers.join(", ") +
      (g.pending > g.pendingMembers.length ? " and " + num(g.pending - g.pendingMembers.length) +
        " more" : "");
    tr.append(el("td", "", g.name), el("td", "", g.namespace),
      el("td", "", num(g.pending) + " pending, " + num(g.bound) + " bound; " + want),
      el("td", "", g.reason), el("td", "sub", held), el("td", "sub", names));
    table.appendChild(tr);
  }
  if (total > gangs.length) {
    const tr = el("tr");
    tr.appendChild(el("td", "sub", "and " + num(total - gangs.length) + " more gangs"));
    table.appendChild(tr);
  }
  return table;
}
function podTable(pods) {
  const table = captioned("Pods tessera refused", ["Pod", "Asks", "Pending", "tessera says",
    "kube-scheduler recorded", "Nearest fit (estimate)"]);
  for (const p of pods) {
    const tr = el("tr");
    tr.dataset.pod = p.pod;
    const why = el("td");
    for (const r of p.tessera) why.appendChild(el("div", "", num(r.nodes) + " nodes: " +
      r.reason.replace(/^tessera: /, "")));
    const near = el("td");
    const e = p.explain;
    if (p.gang) near.textContent = "member of gang " + p.gang +
      ": placed with the whole gang or not at all (see its row above)";
    else if (!e) near.textContent = "-";
    else if (e.fitsNowCount) near.textContent = "fits now on " + num(e.fitsNowCount) +
      " nodes (" + e.fitsNow.join(", ") + ")";
    else if (!e.nearest.length) near.textContent = "no node can take it by waiting (" +
      num(e.hopeless) + " never, " + num(e.closed) + " take no pods)";
    else for (const n of e.nearest) {
      const d = el("div", "", n.node + ": " + n.reason + " (" +
        Math.round(n.closeness * 100) + "% of the ask free)");
      d.style.cursor = "pointer";
      d.onclick = () => select(n.node);
      near.appendChild(d);
    }
    tr.append(el("td", "", p.pod), el("td", "", p.asks.join("; ")),
      el("td", "", ago(p.pendingS)), why, el("td", "sub", p.scheduler || "-"), near);
    table.appendChild(tr);
  }
  return table;
}
function drawFilter() {
  const f = $("filter"), keep = f.value;
  const opts = [["all", "all nodes"], ["problem", "nodes that take no pods"],
    ["free", "nodes with a free GPU"], ["full", "full nodes"]];
  for (const m of models) opts.push(["model:" + m.model, m.model]);
  f.replaceChildren(...opts.map(([v, t]) => { const o = el("option", "", t); o.value = v;
    return o; }));
  f.value = opts.some(([v]) => v === keep) ? keep : "all";
}
function drawStatus(pods, unusable) {
  let gpus = 0;
  for (const m of models) gpus += m.gpus;
  setStatus(num(rows.size) + " nodes, " + num(gpus) + " GPUs, " + num(pods) +
    " pods holding devices, " + num(unusable) + " nodes take no new pods; live, updated " +
    new Date().toLocaleTimeString());
}

// --- the stream ----------------------------------------------------------------------------
let redraw = null;
function take(line) {
  if (line.type === "OVERVIEW") {
    rows.clear();
    for (const r of line.nodes) rows.set(r.n, r);
    models = line.models;
    drawModels(); drawFilter(); drawAll(); drawProblems();
    drawStatus(line.pods, line.unusable);
    setTimeout(() => { refreshDetails(shown()); drawPending(); }, 0);
    return;
  }
  if (line.type !== "ROWS") return;
  for (const r of line.rows) rows.set(r.n, r);
  for (const n of line.gone) rows.delete(n);
  if (line.models) {
    models = line.models;
    drawModels();
    drawStatus(line.pods, line.unusable);
  }
  window.tessera.updates += 1;
  // in name order and nothing came or went, only the changed nodes are drawn again;
  // otherwise the order may change: everything, at most twice a second
  const inPlace = $("sort").value === "name" && $("filter").value === "all" && !line.gone.length &&
    line.rows.every(r => layout && layout.at.has(r.n));
  if (inPlace) {
    const ctx = $("cells").getContext("2d");
    for (const r of line.rows) drawNodeCells(ctx, r.n);
  } else if (redraw === null) {
    redraw = setTimeout(() => { redraw = null; drawAll(); }, 500);
  }
  if (line.rows.some(r => r.p) || line.gone.length) drawProblems();
  const showing = shown().filter(n => line.touched.includes(n));
  if (showing.length) refreshDetails(showing);
}
// a page left for another keeps no stream open (the browser may keep it, frozen, for
// going back): the stream and the connection go back to the scheduler and the browser
let leaving = null;
window.addEventListener("pagehide", () => { if (leaving) leaving.abort(); });
async function watch() {
  leaving = new AbortController();
  const answer = await fetch("/debug/watch?view=overview", { headers, signal: leaving.signal });
  if (!answer.ok) throw new Error("/debug/watch: " + answer.status + " " + await answer.text());
  const reader = answer.body.getReader();
  const text = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += text.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const line = JSON.parse(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 1);
      take(line);
    }
  }
}
async function run() {
  for (;;) {
    try { await watch(); } catch (err) { setStatus("error: " + err.message + "; retrying", true); }
    await new Promise(done => setTimeout(done, 2000));
  }
}
drawLegend();
$("search").addEventListener("input", onSearch);
$("sort").addEventListener("change", drawAll);
$("filter").addEventListener("change", drawAll);
$("cells").addEventListener("mousemove", tip);
$("cells").addEventListener("mouseleave", () => { $("tip").style.display = "none"; });
$("cells").addEventListener("click", e => { const at = nodeAt(e); if (at) select(at.name); });
window.addEventListener("resize", () => { if (rows.size) drawAll(); });
// the refused pods' explanations cost the scheduler more than the overview: after it
setInterval(() => { if (!document.hidden && rows.size) drawPending(); }, 5000);
run();
