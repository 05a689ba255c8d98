
// The coordstore status page (served at /ui/page.js; the page is /ui).
// It refreshes itself from the node's JSON (/ui/api/...) every 2 s.
// Every value from the server is put into the page as text (textContent,
// createTextNode) or through encodeURIComponent; nothing here parses HTML.
"use strict";
(function () {
const REFRESH_MS = 2000, LATE_BARRIER_MS = 60000;
const STATE = { C: "CONNECTED", D: "DISCONNECTED", E: "ERROR" };
const COLOR = { C: "#2f9e44", D: "#b4bcc4", E: "#e03131" }, COLOR_X = "#f0b429";

// ---- small helpers ----
function add(e, c) {
  if (c == null || c === false) return;
  if (Array.isArray(c)) { for (const x of c) add(e, x); return; }
  e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
}
function h(tag, a) {
  const e = document.createElement(tag);
  if (a) for (const k in a) {
    const v = a[k];
    if (v == null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = String(v);
    else if (k === "title") e.title = String(v);
    else if (k === "href") e.href = v;
    else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, String(v));
  }
  for (let i = 2; i < arguments.length; i++) add(e, arguments[i]);
  return e;
}
function fill(e) { e.textContent = ""; for (let i = 1; i < arguments.length; i++) add(e, arguments[i]); return e; }
const $ = (id) => document.getElementById(id);
const isNum = (v) => typeof v === "number" && isFinite(v);
const num = (v) => (isNum(v) ? v : null);
const arr = (v) => (Array.isArray(v) ? v : []);
const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
const str = (v) => (v == null ? "" : String(v));
const fmtInt = (v) => (isNum(v) ? Math.round(v).toLocaleString("en-US") : "—");
function fmtDur(ms) {
  if (!isNum(ms)) return "—";
  if (ms < 0) ms = 0;
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const t = Math.floor(s);
  const two = (a, ua, b, ub) => a + " " + ua + (b ? " " + b + " " + ub : "");
  if (t < 3600) return two(Math.floor(t / 60), "m", t % 60, "s");
  if (t < 86400) return two(Math.floor(t / 3600), "h", Math.floor((t % 3600) / 60), "m");
  return two(Math.floor(t / 86400), "d", Math.floor((t % 86400) / 3600), "h");
}
function fmtBytes(b) {
  if (!isNum(b)) return "—";
  if (b < 1024) return Math.round(b) + " B";
  const u = ["KiB", "MiB", "GiB", "TiB"];
  let i = -1;
  do { b /= 1024; i++; } while (b >= 1024 && i < u.length - 1);
  return (b < 10 ? b.toFixed(1) : Math.round(b)) + " " + u[i];
}
function clock(ms) { const d = new Date(ms); return d.toLocaleTimeString("en-GB"); }
function quota(used, max, fmt) {
  const u = num(used), m = num(max);
  const w = h("span", { class: "q" }, h("span", null, fmt(u), m != null ? h("span", { class: "muted" }, " / " + fmt(m)) : null));
  if (m != null && m > 0 && u != null) {
    const p = Math.min(100, (u / m) * 100);
    const i = h("i", { class: p >= 95 ? "full" : p >= 80 ? "hi" : null });
    i.style.width = p.toFixed(1) + "%";
    w.title = p.toFixed(1) + "% of quota";
    add(w, [h("span", { class: "bar" }, i), h("span", { class: "pct" }, (p < 1 && p > 0 ? p.toFixed(2) : p.toFixed(0)) + "%")]);
  }
  return w;
}
// A wait the leader measured: "≥" when it counts from the leader's takeover.
const waitText = (ms, atLeast) => (isNum(ms) ? (atLeast ? "≥ " : "") + fmtDur(ms) : "—");
const portText = (p) => (isNum(p) ? (p > 0 ? String(p) : "main") : "—");
function badge(cls, text, title) { return h("span", { class: "badge " + cls, title: title }, text); }
function stateBadge(s) {
  const k = str(s).toUpperCase();
  return badge(k === "CONNECTED" ? "b-ok" : k === "ERROR" ? "b-bad" : k === "DISCONNECTED" ? "b-follower" : "b-warn", k || "?");
}
function table(head, rows, cls) {
  return h("div", { class: "wrap" }, h("table", { class: cls },
    h("thead", null, h("tr", null, head.map((c) => h("th", { class: c.n ? "n" : null }, c.t)))),
    h("tbody", null, rows)));
}
const plural = (n, w) => n + " " + w + (n === 1 ? "" : "s");
function none(t) { return h("div", { class: "none" }, t); }

// ---- routing ----
// /ui, /ui/ns/NAME, /ui/ns/NAME/task/TASK, /ui/ns/NAME/barrier/ID
const path = location.pathname;
const m = /^(.*?\/ui)(?:\/ns\/([^/]+)(?:\/(task|barrier)\/(.+?))?)?\/?$/.exec(path);
const BASE = m ? m[1] : "/ui";
const dec = (s) => { try { return decodeURIComponent(s); } catch (e) { return s; } };
const NS = m && m[2] != null ? dec(m[2]) : null;
const SUB = m && m[3] ? { kind: m[3], id: dec(m[4]) } : null;
const enc = encodeURIComponent;
const nsHref = (name) => BASE + "/ns/" + enc(str(name));
const nsApi = () => BASE + "/api/namespaces/" + enc(NS);

// ---- clock: ages are measured against the server's now_ms when known ----
let skew = 0;
const now = () => Date.now() + skew;
const age = (ms) => (isNum(ms) && ms > 0 ? fmtDur(now() - ms) : "—");

async function getJSON(p) {
  const r = await fetch(p, { cache: "no-store", headers: { Accept: "application/json" }, credentials: "same-origin" });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  return { status: r.status, ok: r.ok, body: body };
}
function httpErr(what, r) {
  const msg = r.body && typeof r.body === "object" && r.body.error ? ": " + str(r.body.error) : "";
  return new Error(what + " answered HTTP " + r.status + msg);
}

// ---- cluster panel ----
// A member's disk: what is wrong (free space below the reserve, slow
// fdatasyncs), whether it refuses writes, else its free space.
function disk(d) {
  if (d == null || typeof d !== "object") return "—";
  const out = [];
  if (d.refusing_writes) out.push(badge("b-bad", "refusing writes", str(d.refusing_writes)));
  if (d.below_reserve) out.push(badge("b-bad", "below reserve", str(d.problem)));
  if (d.fsync_slow) out.push(badge("b-warn", "slow fsync", str(d.problem)));
  if (!out.length) out.push(badge("b-ok", "ok", "fdatasync p99 " + str(d.fsync_p99_ms) + " ms"));
  if (isNum(d.free_bytes)) out.push(h("span", { class: "muted" }, " " + fmtBytes(d.free_bytes) + " free"));
  return out;
}
function renderCluster(el, c) {
  c = obj(c);
  if (isNum(c.now_ms)) skew = c.now_ms - Date.now();
  const members = arr(c.members);
  const leader = members.find((x) => obj(x).role === "leader");
  const leaderApplied = leader ? num(leader.applied_index) : null;
  const noLeader = c.leader_id == null || c.leader_id === 0;
  const fl = num(c.feature_level), cfl = num(c.cluster_feature_level);
  const rows = members.map((x) => {
    x = obj(x);
    const err = x.error != null && x.error !== "";
    const why = err ? str(x.error) : x.ready === false ? str(x.not_ready) : "";
    const lag = leaderApplied != null && isNum(x.applied_index) ? Math.max(0, leaderApplied - x.applied_index) : null;
    const role = str(x.role);
    return h("tr", { class: err ? "bad" : null },
      h("td", null, fmtInt(x.id), x.id === c.node_id ? h("span", { class: "muted" }, " (this node)") : null),
      h("td", { class: "mono brk" }, str(x.address)),
      h("td", null, role ? badge("b-" + (["leader", "follower", "learner"].includes(role) ? role : "warn"), role) : "—"),
      h("td", { class: "n" }, fmtInt(x.applied_index)),
      h("td", { class: "n" + (lag > 100 ? " c-E" : "") }, lag == null ? "—" : fmtInt(lag)),
      h("td", null, x.ready === true ? badge("b-ok", "ready") : x.ready === false ? badge("b-bad", "not ready") : "—"),
      h("td", null, disk(x.disk)),
      h("td", { class: "brk" + (why ? " c-E" : "") }, why));
  });
  fill(el, 
    h("h2", null, "Cluster", h("span", { class: "sub" },
      h("span", { class: "mono" }, str(c.cluster_id) || "—"),
      " · node " + fmtInt(c.node_id) + " · leader ",
      noLeader ? badge("b-bad", "none") : fmtInt(c.leader_id),
      " · term " + fmtInt(c.term) + " · feature level " + (fl == null ? "—" : fl) + " (cluster " + (cfl == null ? "—" : cfl) + ")",
      fl != null && cfl != null && fl !== cfl ? [" ", badge("b-warn", "upgrade pending", "this node supports a newer feature level than the cluster runs")] : null)),
    members.length ? table([{ t: "Node" }, { t: "Address" }, { t: "Role" }, { t: "Applied", n: 1 }, { t: "Behind leader", n: 1 }, { t: "Ready" }, { t: "Disk" }, { t: "Why not" }], rows) : none("no members reported"));
  const me = members.find((x) => obj(x).id === c.node_id);
  fill($("crumb"), h("span", { class: "muted" }, "node " + fmtInt(c.node_id) + (me && me.role ? " · " + str(me.role) : "")));
}

// ---- overview ----
const COLS = [
  { k: "name", t: "Namespace", v: (r) => str(r.name), s: true },
  { k: "total", t: "Tasks", n: 1, v: (r) => num(obj(r.tasks).total) },
  { k: "connected", t: "Conn.", n: 1, v: (r) => num(obj(r.tasks).connected) },
  { k: "disconnected", t: "Disc.", n: 1, v: (r) => num(obj(r.tasks).disconnected) },
  { k: "error", t: "Error", n: 1, v: (r) => num(obj(r.tasks).error) },
  { k: "keys", t: "Keys", n: 1, v: (r) => num(r.keys) },
  { k: "bytes", t: "Bytes", n: 1, v: (r) => num(r.bytes) },
  { k: "parked", t: "Parked calls", n: 1, v: (r) => num(r.parked_calls) },
  { k: "barriers", t: "Barriers", n: 1, v: (r) => num(r.barriers_pending) },
  { k: "oldest", t: "Oldest barrier", n: 1, v: (r) => num(r.oldest_barrier_ms) },
  { k: "ttl", t: "TTL", n: 1, v: (r) => num(r.ttl_ms) },
  { k: "created", t: "Created", n: 1, v: (r) => (isNum(r.created_ms) && r.created_ms > 0 ? now() - r.created_ms : null) },
  { k: "active", t: "Last active", n: 1, v: (r) => (isNum(r.last_active_ms) && r.last_active_ms > 0 ? now() - r.last_active_ms : null) },
  { k: "port", t: "Port", n: 1, v: (r) => num(r.port) },
  { k: "epoch", t: "Epoch", n: 1, v: (r) => num(r.epoch) },
];
const sortState = { k: "name", dir: 1 };
let nsData = null;

function buildOverview(app) {
  const filter = h("input", { type: "search", id: "filter", placeholder: "filter by name…", "aria-label": "filter namespaces by name", oninput: renderNsTable });
  const thr = h("tr", null, COLS.map((c) => {
    const th = h("th", { class: "sort" + (c.n ? " n" : ""), tabindex: "0", "data-k": c.k, title: "sort by " + c.t.toLowerCase() }, c.t);
    const go = () => { if (sortState.k === c.k) sortState.dir = -sortState.dir; else { sortState.k = c.k; sortState.dir = c.s ? 1 : -1; } renderNsTable(); };
    th.addEventListener("click", go);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); go(); } });
    return th;
  }));
  fill(app, 
    h("section", { id: "cluster" }, h("h2", null, "Cluster"), none("loading…")),
    h("section", null,
      h("h2", null, "Namespaces", h("span", { class: "sub", id: "nssum" })),
      h("div", { class: "tools" }, filter, h("span", { class: "muted", id: "nscount" }),
        h("span", { class: "legend" },
          h("span", null, h("span", { class: "lg lg-e" }), "tasks in error"),
          h("span", null, h("span", { class: "lg lg-b" }), "barrier pending > 60 s"))),
      h("div", { class: "wrap" }, h("table", { id: "nstable" }, h("thead", null, thr), h("tbody", { id: "nsbody" })))));
}

function renderNsTable() {
  const body = $("nsbody");
  if (!body) return;
  for (const th of document.querySelectorAll("#nstable th")) {
    th.setAttribute("aria-sort", th.getAttribute("data-k") === sortState.k ? (sortState.dir > 0 ? "ascending" : "descending") : "none");
  }
  if (!nsData) { fill(body, h("tr", null, h("td", { colspan: COLS.length, class: "none" }, "loading…"))); return; }
  const all = nsData.map(obj);
  const q = ($("filter").value || "").trim().toLowerCase();
  const col = COLS.find((c) => c.k === sortState.k) || COLS[0];
  const rows = all.filter((r) => !q || str(r.name).toLowerCase().includes(q));
  rows.sort((a, b) => {
    const x = col.v(a), y = col.v(b);
    if (x == null || y == null) return x == null && y == null ? 0 : x == null ? 1 : -1; // empty cells last
    const d = col.n ? x - y : x < y ? -1 : x > y ? 1 : 0;
    return (d || (str(a.name) < str(b.name) ? -1 : 1)) * (d ? sortState.dir : 1);
  });
  let tot = { t: 0, c: 0, d: 0, e: 0, b: 0 };
  for (const r of all) {
    const t = obj(r.tasks);
    tot.t += num(t.total) || 0; tot.c += num(t.connected) || 0; tot.d += num(t.disconnected) || 0; tot.e += num(t.error) || 0;
    tot.b += num(r.barriers_pending) || 0;
  }
  const many = (n, w) => fmtInt(n) + " " + w + (n === 1 ? "" : "s");
  fill($("nssum"), many(all.length, "namespace") + " · " + many(tot.t, "task") + ": ",
    h("span", { class: "c-C" }, fmtInt(tot.c) + " connected"), ", ",
    h("span", { class: "c-D" }, fmtInt(tot.d) + " disconnected"), ", ",
    h("span", { class: tot.e ? "c-E" : "c-D" }, fmtInt(tot.e) + " in error"),
    " · " + many(tot.b, "barrier") + " pending");
  $("nscount").textContent = q ? "showing " + rows.length + " of " + all.length : "";
  fill(body, rows.length ? rows.map(nsRow)
    : [h("tr", null, h("td", { colspan: COLS.length, class: "none" }, all.length ? "no namespace matches the filter" : "no namespaces"))]);
}

function nsRow(r) {
  const t = obj(r.tasks);
  const tc = num(t.connected) || 0, td = num(t.disconnected) || 0, te = num(t.error) || 0, tt = num(t.total);
  const late = isNum(r.oldest_barrier_ms) && r.oldest_barrier_ms > LATE_BARRIER_MS;
  const cls = [te > 0 ? "hl-err" : "", late ? "hl-bar" : ""].join(" ").trim() || null;
  const stack = h("span", { class: "stack" });
  const sum = tc + td + te;
  if (sum > 0) for (const [n, c] of [[tc, "C"], [td, "D"], [te, "E"]]) {
    if (!n) continue;
    const i = h("i"); i.style.width = (100 * n / sum) + "%"; i.style.background = COLOR[c]; stack.appendChild(i);
  }
  const why = [te > 0 ? te + " task(s) in error" : "", late ? "a barrier has been pending for " + fmtDur(r.oldest_barrier_ms) : ""].filter(Boolean).join("; ");
  return h("tr", { class: cls, title: why || null },
    h("td", { class: "brk" }, h("a", { href: nsHref(r.name) }, str(r.name) || "(unnamed)"),
      r.initialized === false ? h("span", { class: "muted" }, " (not configured yet)") : null),
    h("td", { class: "n" }, fmtInt(tt), sum > 0 ? stack : null),
    h("td", { class: "n c-C" }, fmtInt(t.connected)),
    h("td", { class: "n c-D" }, fmtInt(t.disconnected)),
    h("td", { class: "n" + (te ? " c-E" : " c-D") }, fmtInt(t.error)),
    h("td", { class: "n" }, quota(r.keys, r.max_keys, fmtInt)),
    h("td", { class: "n" }, quota(r.bytes, r.max_bytes, fmtBytes)),
    h("td", { class: "n" }, quota(r.parked_calls, r.max_parked_calls, fmtInt)),
    h("td", { class: "n" }, fmtInt(r.barriers_pending)),
    h("td", { class: "n" + (late ? " c-E" : ""), title: r.oldest_barrier != null ? "barrier " + str(r.oldest_barrier) : null }, waitText(r.oldest_barrier_ms, r.oldest_barrier_at_least)),
    h("td", { class: "n" }, isNum(r.ttl_ms) ? fmtDur(r.ttl_ms) : r.ttl_ms === null ? "none" : "—"),
    h("td", { class: "n", title: isNum(r.created_ms) && r.created_ms > 0 ? new Date(r.created_ms).toISOString() : null }, age(r.created_ms)),
    h("td", { class: "n", title: isNum(r.last_active_ms) && r.last_active_ms > 0 ? new Date(r.last_active_ms).toISOString() : null }, age(r.last_active_ms)),
    h("td", { class: "n" }, portText(r.port)),
    h("td", { class: "n" }, fmtInt(r.epoch)));
}

async function loadOverview() {
  const [c, n] = await Promise.allSettled([getJSON(BASE + "/api/cluster"), getJSON(BASE + "/api/namespaces")]);
  const errs = [];
  if (c.status === "fulfilled" && c.value.ok) renderCluster($("cluster"), c.value.body);
  else errs.push(c.status === "fulfilled" ? httpErr("/api/cluster", c.value) : c.reason);
  if (n.status === "fulfilled" && n.value.ok) { nsData = arr(n.value.body); renderNsTable(); }
  else errs.push(n.status === "fulfilled" ? httpErr("/api/namespaces", n.value) : n.reason);
  if (errs.length) throw new Error(errs.map((e) => str(e && e.message ? e.message : e)).join("; "));
}

// ---- namespace view ----
let grid = null, nsCur = null, focus = null, pinned = null;

function buildNamespace(app) {
  document.title = "coordstore · " + NS;
  fill($("crumb"));
  const base = h("canvas", { class: "base", id: "grid", width: "1", height: "1", "aria-label": "task states, one cell per task" });
  const over = h("canvas", { id: "gridover", width: "1", height: "1" });
  fill(app, 
    h("div", null, h("a", { href: BASE + "/" }, "← all namespaces")),
    h("h1", null, h("span", { class: "muted" }, "namespace "), h("span", { id: "nsname" }, NS)),
    h("div", { id: "nsmain" },
      h("section", { id: "focus", hidden: SUB && SUB.kind === "barrier" ? null : "hidden" }),
      h("section", { id: "nssummary" }, none("loading…")),
      h("section", null,
        h("h2", null, "Tasks", h("span", { class: "sub", id: "gridsum" })),
        h("div", { class: "legend", id: "gridlegend" }),
        h("div", { id: "gridbox" }, base, over),
        h("div", { id: "readout" }, h("span", { class: "muted" }, "hover or click a cell to see its task")),
        h("div", { id: "jobs", class: "muted" })),
      h("section", { id: "barriers" }),
      h("section", { id: "torch" }),
      h("section", { id: "errors" }),
      h("div", { class: "cols" }, h("section", { id: "tfdata" }), h("section", { id: "queues" }))),
    h("div", { id: "nsmissing" }));
  grid = { base: base, over: over, states: "", layout: null, hover: -1, pin: -1, w: 0, first: true };
  over.addEventListener("mousemove", (e) => { const i = cellAt(e); if (i !== grid.hover) { grid.hover = i; drawOver(); showTask(i >= 0 ? i : grid.pin); } });
  over.addEventListener("mouseleave", () => { grid.hover = -1; drawOver(); showTask(grid.pin); });
  over.addEventListener("click", (e) => { const i = cellAt(e); setPin(i === grid.pin ? -1 : i); });
  let rt = null;
  window.addEventListener("resize", () => { clearTimeout(rt); rt = setTimeout(() => drawGrid(true), 150); });
}

function layoutFor(n, W) {
  let best = null;
  for (let cs = 16; cs >= 2; cs--) {
    const max = Math.max(1, Math.floor(W / cs));
    let cols = max;
    let p = 1; while (p * 2 <= max) p *= 2;
    if (p >= 0.75 * max) cols = p; else if (max >= 32) cols = max - (max % 16);
    if (cols > n) cols = Math.max(1, n);
    best = { cs: cs, cols: cols, rows: Math.max(1, Math.ceil(n / cols)), gap: cs >= 6 ? 1 : 0 };
    if (best.rows * cs <= 520) break;
  }
  return best;
}

function drawGrid(force) {
  if (!grid) return;
  const s = grid.states, n = s.length;
  const W = Math.max(200, $("gridbox").clientWidth || 800);
  if (!force && grid.drawn === s && grid.w === W) return;
  const t0 = performance.now();
  const L = layoutFor(Math.max(n, 1), W), dpr = window.devicePixelRatio || 1;
  const cw = L.cols * L.cs, ch = n ? L.rows * L.cs : 0;
  for (const c of [grid.base, grid.over]) {
    c.width = Math.max(1, Math.round(cw * dpr)); c.height = Math.max(1, Math.round(ch * dpr));
    c.style.width = cw + "px"; c.style.height = ch + "px";
  }
  const ctx = grid.base.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, cw, ch);
  const cs = L.cs, g = L.gap, cols = L.cols;
  let cur = "";
  if (g === 0) {
    // Runs of one state within a row become one rectangle.
    for (let i = 0; i < n;) {
      const c = s[i], col = i % cols;
      let j = i + 1;
      while (j < n && s[j] === c && j % cols !== 0) j++;
      const f = COLOR[c] || COLOR_X;
      if (f !== cur) { ctx.fillStyle = f; cur = f; }
      ctx.fillRect(col * cs, Math.floor(i / cols) * cs, (j - i) * cs, cs);
      i = j;
    }
  } else {
    for (let i = 0; i < n; i++) {
      const f = COLOR[s[i]] || COLOR_X;
      if (f !== cur) { ctx.fillStyle = f; cur = f; }
      ctx.fillRect((i % cols) * cs, Math.floor(i / cols) * cs, cs - g, cs - g);
    }
  }
  if (cs <= 4) {
    // Tiny cells: draw tasks in error a little larger so that they stand out.
    ctx.fillStyle = COLOR.E;
    for (let i = s.indexOf("E"); i >= 0; i = s.indexOf("E", i + 1)) ctx.fillRect((i % cols) * cs - 1, Math.floor(i / cols) * cs - 1, cs + 2, cs + 2);
  }
  grid.layout = L; grid.drawn = s; grid.w = W;
  grid.base.setAttribute("data-cells", String(n));
  grid.base.setAttribute("data-cols", String(cols));
  grid.base.setAttribute("data-cell-px", String(cs));
  grid.base.setAttribute("data-draw-ms", (performance.now() - t0).toFixed(1));
  if (grid.hover >= n) grid.hover = -1;
  if (grid.pin >= n) grid.pin = -1;
  drawOver();
}
function drawOver() {
  const L = grid.layout; if (!L) return;
  const ctx = grid.over.getContext("2d"), dpr = window.devicePixelRatio || 1;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, grid.over.width, grid.over.height);
  for (const [i, col] of [[grid.pin, "#111"], [grid.hover, "#1c62b9"]]) {
    if (i < 0) continue;
    const x = (i % L.cols) * L.cs, y = Math.floor(i / L.cols) * L.cs, sz = Math.max(L.cs, 6);
    ctx.lineWidth = 2; ctx.strokeStyle = col;
    ctx.strokeRect(x - (sz - L.cs) / 2 - 1, y - (sz - L.cs) / 2 - 1, sz + 2 - L.gap, sz + 2 - L.gap);
  }
}
function cellAt(e) {
  const L = grid.layout; if (!L) return -1;
  const r = grid.over.getBoundingClientRect();
  const c = Math.floor((e.clientX - r.left) / L.cs), row = Math.floor((e.clientY - r.top) / L.cs);
  if (c < 0 || c >= L.cols || row < 0) return -1;
  const i = row * L.cols + c;
  return i < grid.states.length ? i : -1;
}
function taskOf(i) {
  for (const j of arr(obj(obj(nsCur).tasks).jobs)) {
    const f = num(obj(j).first_index), n = num(j.count);
    if (f != null && n != null && i >= f && i < f + n) return { job: str(j.name), id: i - f };
  }
  return null;
}
function taskName(i) { const t = taskOf(i); return t ? "/job:" + t.job + "/replica:0/task:" + t.id : null; }
// The path of task i under /ui/ns/NAME/task/ and /api/namespaces/NAME/tasks/.
function taskPath(i) { const t = taskOf(i); return t ? enc(t.job) + "/" + t.id : String(i); }
function heartbeatText(x) {
  x = obj(x);
  if (isNum(x.heartbeat_age_ms)) return fmtDur(x.heartbeat_age_ms) + " ago";
  if (isNum(x.disconnected_age_ms)) return "disconnected " + fmtDur(x.disconnected_age_ms) + " ago";
  if (x.state === "DISCONNECTED") return "never connected";
  return "—";
}
function showTask(i) {
  const ro = $("readout");
  if (!ro) return;
  if (i == null || i < 0 || !grid || i >= grid.states.length) { fill(ro, h("span", { class: "muted" }, "hover or click a cell to see its task")); return; }
  const c = grid.states[i], d = obj(nsCur);
  const err = arr(d.errors).find((e) => obj(e).index === i);
  const waits = [];
  for (const b of arr(d.barriers)) if (arr(obj(b).missing).some((x) => obj(x).index === i)) waits.push(str(b.id));
  const p = pinned && pinned.index === i ? pinned : null;
  fill(ro, h("span", { class: "s-" + (COLOR[c] ? c : "X") }), "task " + i + " · ",
    h("span", { class: "tn", id: "readout-task" }, taskName(i) || "(no job)"), " · ",
    h("span", { class: "c-" + c, id: "readout-state" }, STATE[c] || "unknown state '" + c + "'"),
    err ? [" · ", h("span", { class: "c-E" }, str(err.code) + ": " + str(err.message))] : null,
    p ? " · " + (isNum(p.heartbeat_age_ms) ? "last heartbeat " : "") + heartbeatText(p) : null,
    p && /[^0]/.test(str(p.incarnation)) ? [" · incarnation ", h("span", { class: "mono" }, str(p.incarnation))] : null,
    waits.length ? " · missing at barrier " + waits.join(", ") : null,
    grid.pin === i ? h("span", { class: "muted" }, " (pinned; click again to release)") : null);
}
function setPin(i) {
  grid.pin = i; drawOver(); showTask(i);
  const at = BASE + "/ns/" + enc(NS) + (i >= 0 ? "/task/" + taskPath(i) : "");
  try { history.replaceState(null, "", at); } catch (e) { /* ignore */ }
  if (i >= 0 && (!pinned || pinned.index !== i)) loadPinned().then(() => showTask(grid.hover >= 0 ? grid.hover : grid.pin), () => {});
}
function pinTask(i) {
  if (!grid || !isNum(i) || i < 0 || i >= grid.states.length) return;
  setPin(i);
  grid.over.scrollIntoView({ block: "nearest" });
}
function taskLink(i, name) {
  return isNum(i) ? h("span", { class: "link tn brk", title: "show task " + i + " in the grid", onclick: () => pinTask(i) }, name || taskName(i) || "task " + i)
    : h("span", { class: "tn brk" }, name || "—");
}

function card(k, v, sub) { return h("div", null, h("div", { class: "k" }, k), h("div", { class: "v" }, v, sub ? h("small", null, " " + sub) : null)); }

function renderNamespace(d) {
  d = obj(d); nsCur = d;
  fill($("nsmissing"));
  $("nsmain").style.display = "";
  const t = obj(d.tasks);
  const late = isNum(d.oldest_barrier_ms) && d.oldest_barrier_ms > LATE_BARRIER_MS;
  fill($("nssummary"),
    d.initialized === false ? h("p", { class: "note" }, "This namespace is not configured yet: it has no tasks to show.") : null,
    h("div", { class: "kv" },
    card("Tasks", fmtInt(t.total), ""),
    h("div", { class: "w2" }, h("div", { class: "k" }, "By state"), h("div", { class: "v", id: "nsstates" },
      h("span", { class: "nw" }, h("span", { class: "c-C" }, fmtInt(t.connected)), h("small", null, " connected · ")),
      h("span", { class: "nw" }, h("span", { class: "c-D" }, fmtInt(t.disconnected)), h("small", null, " disconnected · ")),
      h("span", { class: "nw" }, h("span", { class: num(t.error) ? "c-E" : "c-D" }, fmtInt(t.error)), h("small", null, " error")))),
    card("Keys", quota(d.keys, d.max_keys, fmtInt)),
    card("Bytes", quota(d.bytes, d.max_bytes, fmtBytes)),
    card("Parked calls", quota(d.parked_calls, d.max_parked_calls, fmtInt)),
    h("div", null, h("div", { class: "k" }, "Barriers pending"), h("div", { class: "v", id: "nsbarriers" }, fmtInt(d.barriers_pending),
      isNum(d.oldest_barrier_ms) ? h("small", { class: late ? "c-E" : null }, " oldest " + waitText(d.oldest_barrier_ms, d.oldest_barrier_at_least)) : null)),
    card("TTL", isNum(d.ttl_ms) ? fmtDur(d.ttl_ms) : d.ttl_ms === null ? "none" : "—"),
    card("Created", age(d.created_ms), isNum(d.created_ms) && d.created_ms > 0 ? "ago" : ""),
    card("Last active", age(d.last_active_ms), isNum(d.last_active_ms) && d.last_active_ms > 0 ? "ago" : ""),
    card("Port", portText(d.port)),
    card("Epoch", fmtInt(d.epoch))));

  // grid
  const states = typeof t.states === "string" ? t.states : "";
  grid.states = states;
  const cnt = { C: 0, D: 0, E: 0, X: 0 };
  for (let i = 0; i < states.length; i++) { const c = states.charCodeAt(i); if (c === 67) cnt.C++; else if (c === 68) cnt.D++; else if (c === 69) cnt.E++; else cnt.X++; }
  $("gridsum").textContent = states.length ? fmtInt(states.length) + " cells, one per task, by task index" : "";
  const errCells = [];
  for (let i = states.indexOf("E"); i >= 0 && errCells.length < 100; i = states.indexOf("E", i + 1)) errCells.push(i);
  grid.base.setAttribute("data-error-cells", errCells.join(","));
  const lg = [["C", "connected"], ["D", "disconnected"], ["E", "error"]].map(([k, n]) => h("span", null, h("span", { class: "s-" + k }), n + " " + fmtInt(cnt[k])));
  if (cnt.X) lg.push(h("span", null, h("span", { class: "s-X" }), "other " + fmtInt(cnt.X)));
  fill($("gridlegend"), states.length ? lg : [none(isNum(t.total) && t.total > 0 ? "no per-task states reported" : "no tasks")]);
  drawGrid(false);
  if (grid.first) {
    grid.first = false;
    if (pinned && pinned.index < states.length) grid.pin = pinned.index;
    drawOver();
  }
  $("readout").style.display = states.length ? "" : "none";
  showTask(grid.hover >= 0 ? grid.hover : grid.pin);
  const jobs = arr(t.jobs);
  fill($("jobs"), jobs.length ? ["Jobs: ", jobs.map((j, k) => {
    j = obj(j); const f = num(j.first_index), n = num(j.count);
    return [k ? " · " : "", h("span", { class: "tn" }, str(j.name)), " " + (f != null && n != null ? (n ? "tasks " + f + "–" + (f + n - 1) : "no tasks") : "") + " (" + fmtInt(n) + ")"];
  })] : null);

  // barriers
  const bars = arr(d.barriers);
  fill($("barriers"), h("h2", null, "Pending barriers", h("span", { class: "sub" }, bars.length ? String(bars.length) : "")),
    d.ages_from_leader === false ? h("p", { class: "note" }, "The leader did not answer: waits and heartbeat ages (which only the leader knows) are left out.") : null,
    bars.length ? bars.map(barrierBox) : none("no barrier is pending"));

  renderTorch(obj(d.torch));

  // errors
  const errs = arr(d.errors);
  fill($("errors"), h("h2", null, "Tasks in error", h("span", { class: "sub" }, errs.length ? (num(t.error) > errs.length ? "showing " + errs.length + " of " + fmtInt(t.error) : String(errs.length)) : "")),
    errs.length ? table([{ t: "Index", n: 1 }, { t: "Task" }, { t: "Code" }, { t: "Message" }], errs.map((e) => {
      e = obj(e);
      return h("tr", null, h("td", { class: "n" }, fmtInt(e.index)), h("td", null, taskLink(num(e.index), str(e.name))),
        h("td", null, badge("b-bad", str(e.code) || "?")), h("td", { class: "brk" }, str(e.message)));
    })) : none("no task is in error"));

  // tf.data
  const tf = obj(d.tfdata), tj = arr(tf.jobs), tw = arr(tf.workers);
  fill($("tfdata"), h("h2", null, "tf.data service", h("span", { class: "sub" }, plural(tj.length, "job") + " · " + plural(tw.length, "worker"))),
    tj.length ? table([{ t: "Job id", n: 1 }, { t: "Name" }, { t: "Dataset" }, { t: "Consumers", n: 1 }], tj.map((j) => {
      j = obj(j);
      return h("tr", null, h("td", { class: "n" }, fmtInt(j.job_id)), h("td", { class: "mono brk" }, str(j.name)), h("td", { class: "mono brk" }, str(j.dataset_id)), h("td", { class: "n" }, fmtInt(j.num_consumers)));
    })) : none("no tf.data jobs"),
    h("div", { class: "gap" }),
    tw.length ? table([{ t: "Worker" }, { t: "Tags" }], tw.map((w) => {
      w = obj(w);
      const tags = arr(w.tags);
      return h("tr", null, h("td", { class: "mono brk" }, str(w.address)), h("td", null, tags.length ? tags.map((x) => h("span", { class: "chip" }, str(x))) : h("span", { class: "muted" }, "—")));
    })) : none("no tf.data workers"));

  // closure queues
  const qs = arr(d.closure_queues);
  fill($("queues"), h("h2", null, "Closure queues", h("span", { class: "sub" }, qs.length ? String(qs.length) : "")),
    qs.length ? table([{ t: "Queue" }, { t: "Pending", n: 1 }, { t: "Queued", n: 1 }, { t: "Running", n: 1 }, { t: "Records", n: 1 }], qs.map((q) => {
      q = obj(q);
      return h("tr", null, h("td", { class: "mono brk" }, str(q.name)), h("td", { class: "n" }, fmtInt(q.pending)), h("td", { class: "n" }, fmtInt(q.queued)), h("td", { class: "n" }, fmtInt(q.running)), h("td", { class: "n" }, fmtInt(q.records)));
    })) : none("no closure queues"));
}

// The PyTorch store: the keys ranks wait on and who waits, the counters
// ranks ADD to (a store barrier's), the connections by node. Keys,
// addresses and counts only: the JSON carries no value.
function renderTorch(t) {
  const keys = arr(t.keys), cs = arr(t.counters), nodes = arr(t.nodes);
  const kw = num(t.keys_waited_on), wc = num(t.waiting_connections);
  fill($("torch"), h("h2", null, "PyTorch store", h("span", { class: "sub" }, t.error ? "" :
      plural(wc || 0, "connection") + " waiting on " + plural(kw || 0, "key") + " · " + plural(num(t.stored_keys) || 0, "key") + " stored" +
      (isNum(t.last_write_age_ms) ? " · last write " + fmtDur(t.last_write_age_ms) + " ago" : ""))),
    t.error ? h("p", { class: "note" }, "The store's waits could not be read: " + str(t.error)) : null,
    keys.length ? keys.map(torchKeyBox) : t.error ? null : none("no key is waited on"),
    kw > keys.length ? h("div", { class: "muted" }, "… and " + fmtInt(kw - keys.length) + " more keys") : null,
    cs.length ? [h("div", { class: "gap" }), table([{ t: "Counter" }, { t: "Value", n: 1 }, { t: "Of", n: 1 }, { t: "Adds", n: 1 }, { t: "Last add", n: 1 }], cs.map((c) => {
      c = obj(c);
      const v = num(c.value), of = num(c.of);
      return h("tr", { class: "counter" }, h("td", { class: "mono brk" }, str(c.key)),
        h("td", { class: "n" + (v != null && of && v < of ? " c-E" : "") }, fmtInt(v)),
        h("td", { class: "n", title: of ? "from " + str(c.of_from) : "" }, of ? fmtInt(of) : "—"),
        h("td", { class: "n" }, fmtInt(c.adds)), h("td", { class: "n" }, isNum(c.last_add_ms) ? fmtDur(c.last_add_ms) + " ago" : "—"));
    }), "fit")] : null,
    nodes.length ? [h("div", { class: "gap" }), table([{ t: "Node", n: 1 }, { t: "Connections", n: 1 }, { t: "Waiting", n: 1 }, { t: "" }], nodes.map((n) => {
      n = obj(n);
      return h("tr", null, h("td", { class: "n" }, fmtInt(n.node_id)), h("td", { class: "n" }, fmtInt(n.connections)), h("td", { class: "n" }, fmtInt(n.waiting)),
        h("td", { class: "muted brk" }, n.error ? "no answer: " + str(n.error) : ""));
    }), "fit")] : null);
}
function torchKeyBox(k) {
  k = obj(k);
  const ws = arr(k.waiters), n = num(k.waiting) || 0, late = isNum(k.oldest_wait_ms) && k.oldest_wait_ms > LATE_BARRIER_MS;
  return h("div", { class: "barrier tkey" + (late ? " late" : "") },
    h("div", { class: "hd" }, h("span", { class: "id mono brk" }, str(k.key)),
      h("span", null, h("strong", null, fmtInt(n)), n === 1 ? " connection waits" : " connections wait"),
      isNum(k.oldest_wait_ms) ? h("span", { class: late ? "c-E" : null }, "oldest " + fmtDur(k.oldest_wait_ms)) : null,
      late ? badge("b-warn", "> 60 s") : null),
    ws.length ? table([{ t: "Node", n: 1 }, { t: "Address" }, { t: "PID", n: 1 }, { t: "Waited", n: 1 }], ws.map((w) => {
      w = obj(w);
      return h("tr", { class: "waiter" }, h("td", { class: "n" }, fmtInt(w.node_id)), h("td", { class: "mono" }, str(w.address) || "—"),
        h("td", { class: "n" }, isNum(w.pid) ? String(w.pid) : "—"), h("td", { class: "n" }, isNum(w.waited_ms) ? fmtDur(w.waited_ms) : "—"));
    }), "fit") : null,
    n > ws.length ? h("div", { class: "muted" }, "… and " + fmtInt(n - ws.length) + " more") : null);
}

function barrierBox(b) {
  b = obj(b);
  const a = num(b.arrived), e = num(b.expected), late = isNum(b.waited_ms) && b.waited_ms > LATE_BARRIER_MS;
  const miss = arr(b.missing), mc = num(b.missing_count), st = str(b.status);
  const p = h("span", { class: "prog" }, h("i"));
  if (a != null && e) p.firstChild.style.width = Math.min(100, 100 * a / e) + "%";
  const more = mc != null && mc > miss.length ? mc - miss.length : 0;
  return h("div", { class: "barrier" + (late ? " late" : "") + (SUB && SUB.kind === "barrier" && SUB.id === str(b.id) ? " focus" : "") },
    h("div", { class: "hd" },
      h("a", { class: "id", href: BASE + "/ns/" + enc(NS) + "/barrier/" + enc(str(b.id)) }, str(b.id) || "(no id)"),
      isNum(b.counter) ? h("span", { class: "muted" }, "counter " + b.counter) : null,
      st && st !== "PENDING" ? badge(st === "PASSED" ? "b-ok" : "b-bad", st) : null,
      h("span", null, "arrived ", h("strong", null, fmtInt(a)), " of ", h("strong", null, fmtInt(e))), p,
      st === "PENDING" || !st ? h("span", { class: late ? "c-E" : null }, "waiting " + waitText(b.waited_ms, b.waited_at_least)) : null,
      late ? badge("b-warn", "> 60 s") : null,
      isNum(b.deadline_ms) && b.deadline_ms > 0 && st === "PENDING" ? h("span", { class: "muted" }, "deadline in " + fmtDur(b.deadline_ms - now())) : null),
    b.error ? h("div", { class: "c-E brk" }, str(b.error)) : null,
    miss.length || more ? [h("div", { class: "muted" }, "Missing " + fmtInt(mc != null ? mc : miss.length) + ":"),
      table([{ t: "Index", n: 1 }, { t: "Task" }, { t: "State" }, { t: "Last heartbeat", n: 1 }], miss.map((x) => {
        x = obj(x);
        return h("tr", { class: "missing" }, h("td", { class: "n" }, fmtInt(x.index)), h("td", null, taskLink(num(x.index), str(x.name))), h("td", null, stateBadge(x.state)), h("td", { class: "n" }, heartbeatText(x)));
      }), "fit"),
      more ? h("div", { class: "muted" }, "… and " + fmtInt(more) + " more") : null] : null);
}

function renderNotFound(what, msg) {
  nsCur = null;
  $("nsmain").style.display = "none";
  fill($("nsmissing"), h("section", { class: "nf" },
    h("div", { class: "big", id: "notfound" }, "404 — " + what + " does not exist"),
    msg && msg !== what + " does not exist" ? h("p", { class: "muted brk" }, msg) : null,
    h("p", null, h("a", { href: BASE + "/" }, "see all namespaces"))));
}
function apiError(r) { return r.body && typeof r.body === "object" && r.body.error ? str(r.body.error) : ""; }

// The task the page pins (its route, or a click): its heartbeat age and
// incarnation come from the task's own endpoint.
async function loadPinned() {
  const ref = grid && grid.pin >= 0 ? taskPath(grid.pin) : SUB && SUB.kind === "task" ? SUB.id.split("/").map(enc).join("/") : null;
  if (ref == null) { pinned = null; return true; }
  const r = await getJSON(nsApi() + "/tasks/" + ref);
  if (r.status === 404 && !nsCur) { renderNotFound("task " + (SUB ? SUB.id : ref) + " of namespace " + NS, apiError(r)); return false; }
  pinned = r.ok ? obj(r.body) : null;
  return true;
}
// The barrier of a /barrier/ID route, pending or not.
async function loadFocus() {
  const r = await getJSON(nsApi() + "/barriers/" + enc(SUB.id));
  if (r.status === 404) { renderNotFound("barrier " + SUB.id + " of namespace " + NS, apiError(r)); return false; }
  if (!r.ok) throw httpErr("/api/namespaces/" + NS + "/barriers/" + SUB.id, r);
  focus = obj(r.body);
  return true;
}

async function loadNamespace() {
  const [n, c] = await Promise.allSettled([getJSON(nsApi()), getJSON(BASE + "/api/cluster")]);
  if (c.status === "fulfilled" && c.value.ok) {
    const cb = obj(c.value.body);
    if (isNum(cb.now_ms)) skew = cb.now_ms - Date.now();
    const me = arr(cb.members).find((x) => obj(x).id === cb.node_id);
    fill($("crumb"), h("a", { href: BASE + "/" }, str(cb.cluster_id) || "cluster"), h("span", { class: "muted" }, " · node " + fmtInt(cb.node_id) + (me && me.role ? " · " + str(me.role) : "")));
  }
  if (n.status === "rejected") throw n.reason;
  if (n.value.status === 404) { renderNotFound("namespace " + NS, apiError(n.value)); return; }
  if (!n.value.ok) throw httpErr("/api/namespaces/" + NS, n.value);
  if (SUB && SUB.kind === "barrier" && !(await loadFocus())) return;
  if ((grid.pin >= 0 || (SUB && SUB.kind === "task" && grid.first)) && !(await loadPinned())) return;
  const t0 = performance.now();
  if (focus) fill($("focus"), h("h2", null, "Barrier"), barrierBox(focus));
  renderNamespace(n.value.body);
  document.body.setAttribute("data-render-ms", (performance.now() - t0).toFixed(1));
  if (c.status === "fulfilled" && !c.value.ok) throw httpErr("/api/cluster", c.value);
}

// ---- refresh loop ----
let timer = null, busy = false, lastOk = 0;
const load = NS == null ? loadOverview : loadNamespace;
function setUpd() {
  const el = $("upd");
  if (document.hidden) { el.textContent = "paused while the tab is hidden"; $("dot").className = "dot idle"; return; }
  el.textContent = lastOk ? "updated " + clock(lastOk) + " · " + fmtDur(Date.now() - lastOk) + " ago · every " + REFRESH_MS / 1000 + " s" : "loading…";
}
async function tick() {
  timer = null;
  if (busy) return;
  if (document.hidden) { setUpd(); schedule(); return; }
  busy = true; $("dot").className = "dot busy";
  try {
    await load();
    lastOk = Date.now();
    if (!document.body.hasAttribute("data-first-render-ms")) document.body.setAttribute("data-first-render-ms", performance.now().toFixed(0));
    $("banner").className = ""; fill($("banner"));
    $("dot").className = "dot";
  } catch (e) {
    $("dot").className = "dot bad";
    fill($("banner"), h("strong", null, "Refresh failed: "), str(e && e.message ? e.message : e),
      lastOk ? " — showing data from " + clock(lastOk) + "." : "", " Retrying every " + REFRESH_MS / 1000 + " s.");
    $("banner").className = "on";
  } finally {
    busy = false; setUpd(); schedule();
  }
}
function schedule() { clearTimeout(timer); timer = setTimeout(tick, REFRESH_MS); }
document.addEventListener("visibilitychange", () => { setUpd(); if (!document.hidden && !busy) { clearTimeout(timer); tick(); } });
setInterval(() => { if (!busy) setUpd(); }, 1000);

if (NS == null) { buildOverview($("app")); renderNsTable(); }
else buildNamespace($("app"));
tick();
})();
