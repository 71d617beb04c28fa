// The celery-ha dashboard: polls /api/dashboard and draws it. No library, no network beyond this
// server. Every value is written with textContent (never as HTML), so task URLs and error texts from
// the crawl cannot inject markup.
"use strict";

const params = new URLSearchParams(location.search);
// ?interval=MS, at least 250; anything that is not a positive number (?interval=x is NaN, and
// setInterval(f, NaN) polls back-to-back) means the default.
const ASKED_MS = Number(params.get("interval"));
const INTERVAL_MS = Number.isFinite(ASKED_MS) && ASKED_MS > 0 ? Math.max(250, ASKED_MS) : 2000;
const STATES = ["queued", "dispatched", "running", "delayed", "completed", "dead"];
let session = { actions: false, csrf: null };
let refreshes = 0;
const samples = []; // [seconds (Redis clock), done] for the finishing rate

const $ = (id) => document.getElementById(id);
// Absolute URLs on the page's origin: a page opened as http://user:pass@host/ would otherwise resolve
// "/api/..." to a URL with credentials, which fetch() refuses.
// A server of several namespaces shows the one of the page's ?namespace= (its first by default).
const NAMESPACE = params.get("namespace");
const api = (path) => location.origin + path
  + (NAMESPACE ? (path.includes("?") ? "&" : "?") + "namespace=" + encodeURIComponent(NAMESPACE) : "");
const fmtInt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));

function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function fmtAgo(epoch, now) {
  return epoch ? fmtSeconds(Math.max(0, now - epoch)) + " ago" : "–";
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function fillTable(id, rows, render) {
  const body = $(id).querySelector("tbody");
  body.replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    for (const cell of render(row)) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
    return tr;
  }));
}

function actionButton(label, path, body) {
  const td = el("td");
  if (!session.actions) return td;
  const button = el("button", label, "action");
  button.addEventListener("click", () => act(path, body, button));
  td.appendChild(button);
  return td;
}

async function act(path, body, button) {
  if (button) button.disabled = true;
  try {
    const res = await fetch(api(path), {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": session.csrf },
      body: JSON.stringify(body),
    });
    const doc = await res.json();
    $("message").textContent = res.ok ? `${path}: ${JSON.stringify(doc)}` : `${path}: ${doc.error}`;
  } catch (err) {
    $("message").textContent = `${path}: ${err}`;
  }
  refresh();
}

function finishingRate(now, done) {
  samples.push([now, done]);
  while (samples.length > 2 && now - samples[0][0] > 30) samples.shift();
  const [t0, d0] = samples[0];
  return now > t0 ? (done - d0) / (now - t0) : null;
}

function drawThroughput(tp, now) {
  const svg = $("throughput");
  const ns = "http://www.w3.org/2000/svg";
  const W = 600, H = 160, top = 10, bottom = 18;
  const series = tp.series;
  const max = Math.max(1, ...series.map((b) => b.completed + b.dead));
  const w = W / series.length;
  const nodes = [];
  const rect = (x, y, width, height, cls) => {
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", x); r.setAttribute("y", y); r.setAttribute("width", width);
    r.setAttribute("height", Math.max(0, height)); r.setAttribute("class", cls);
    return r;
  };
  series.forEach((b, i) => {
    const x = i * w + 1;
    if (tp.covered_since && b.t + tp.bucket_seconds <= tp.covered_since) {
      nodes.push(rect(x, top, w - 2, H - top - bottom, "uncovered"));
      return;
    }
    const scale = (H - top - bottom) / max;
    const hOk = b.completed * scale, hBad = b.dead * scale;
    nodes.push(rect(x, H - bottom - hOk, w - 2, hOk, "ok"));
    nodes.push(rect(x, H - bottom - hOk - hBad, w - 2, hBad, "bad"));
  });
  for (const [text, x, anchor] of [["-10 min", 2, "start"], ["-5 min", W / 2, "middle"], ["now", W - 2, "end"]]) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", x); t.setAttribute("y", H - 4); t.setAttribute("text-anchor", anchor);
    t.setAttribute("class", "axis"); t.textContent = text; nodes.push(t);
  }
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 4); label.setAttribute("y", top + 8); label.setAttribute("class", "axis");
  label.textContent = `max ${max} / ${tp.bucket_seconds}s`; nodes.push(label);
  svg.replaceChildren(...nodes);
  $("throughput-note").textContent = tp.covered_since
    ? `(history trimmed: complete since ${fmtAgo(tp.covered_since, now)})` : "";
}

function render(d) {
  const s = d.stats;
  $("namespace").textContent = `namespace ${d.namespace}`;
  const notices = [...(s.warnings || [])];
  if (s.paused) {
    notices.unshift(`paused ${fmtAgo(s.paused.since, d.now)}${s.paused.reason ? ": " + s.paused.reason : ""}`
                    + " — no new task is dispatched until `celery-ha resume`");
  }
  $("notices").replaceChildren(...notices.map((text) => el("div", text, "notice")));
  for (const state of STATES) $(`count-${state}`).textContent = fmtInt(s[state]);
  $("count-items").textContent = fmtInt(s.items);
  $("count-workers").textContent = fmtInt(d.workers_alive);
  const { done, total } = d.progress;
  const pct = total ? (100 * done) / total : 0;
  $("progress-bar").style.width = `${pct.toFixed(1)}%`;
  $("progress-text").textContent = `${fmtInt(done)} / ${fmtInt(total)} done (${pct.toFixed(1)} %)`;
  const rate = finishingRate(d.now, done);
  $("rate").textContent = rate === null ? "–" : `${rate.toFixed(1)} tasks/s`;
  $("eta").textContent = rate > 0 && total > done ? `eta ${fmtSeconds((total - done) / rate)}` : "";
  $("oldest-queued").textContent = fmtSeconds(d.oldest_queued_seconds);
  drawThroughput(d.throughput, d.now);

  const lat = d.latency;
  const latRows = [{ task: "all", wait: lat.wait, runtime: lat.runtime }, ...lat.by_task];
  fillTable("latency", latRows, (r) => [r.task, fmtSeconds(r.wait.p50), fmtSeconds(r.wait.p90),
    fmtSeconds(r.wait.p99), fmtSeconds(r.runtime.p50), fmtSeconds(r.runtime.p90), fmtSeconds(r.runtime.p99),
    fmtInt(r.wait.count)]);

  $("workers-note").textContent = `${d.workers.length} alive, ${s.running} leases`;
  fillTable("workers", d.workers, (w) => [w.name, `${w.age.toFixed(1)} s ago`,
    el("td", w.tasks.length ? `${w.tasks.length}: ${w.tasks.join(", ")}` : "0", "wrap")]);

  $("dead-note").textContent = `${fmtInt(s.dead)} dead${s.dead > d.dead.length ? `, newest ${d.dead.length} shown` : ""}`;
  $("redrive-all").hidden = !(session.actions && s.dead > 0);
  fillTable("dead", d.dead, (t) => [t.id, t.task, el("td", t.url, "wrap"), el("td", t.error, "wrap"),
    t.attempts, t.stalls, fmtAgo(t.died_at, d.now), actionButton("Redrive", "/api/dead/redrive", { id: t.id })]);

  const z = d.proxy_zones;
  $("proxy-zones").textContent = `avail ${z.avail} · in use ${z.in_use} · new ${z.new} · temp-banned ${z.tban} · banned ${z.pban}`;
  fillTable("proxies", d.proxies, (p) => [el("td", p.url, "wrap"), el("td", p.state, `zone-${p.state}`),
    p.score.toFixed(3), `${(100 * p.success).toFixed(0)} %`, p.latency_ms < 0 ? "–" : `${p.latency_ms} ms`,
    fmtInt(p.ok), fmtInt(p.transport_errors), fmtInt(p.blocked), fmtInt(p.server_errors),
    el("td", p.state === "tban" ? `until ${new Date(p.ban_until_ms).toLocaleTimeString()} ${p.ban_reason}`
      : p.state === "pban" ? `permanent ${p.ban_reason}` : "", "wrap"),
    p.state === "tban" || p.state === "pban" ? actionButton("Unban", "/api/proxies/unban", { id: p.id }) : el("td")]);
  fillTable("domains", d.domains, (m) => [m.domain, fmtInt(m.acquired), fmtInt(m.refused), fmtInt(m.in_use),
    fmtInt(m.rate_limited), fmtInt(m.banned)]);

  const h = d.hosts || { enabled: false, known: 0, top: [] };
  const hz = d.host_zones || {};
  $("host-zones").textContent = h.enabled
    ? `${fmtInt(h.known)} known · eligible ${hz.eligible} · waiting ${hz.waiting} · parked ${hz.parked}`
      + (h.top.length || !h.known ? "" : " · too many to list here: celery-ha hosts list")
    : "host gate off";
  const limits = (x) => [x.rate ? `rate ${x.rate}` : "", x.delay ? `delay ${x.delay}s` : "",
    x.crawl_delay ? `crawl-delay ${x.crawl_delay}s` : "", x.concurrency ? `max ${x.concurrency}` : ""]
    .filter(Boolean).join(", ") || "–";
  fillTable("hosts", h.top, (x) => [x.host, x.state, fmtInt(x.queued), fmtInt(x.running), fmtInt(x.done),
    fmtInt(x.dead), limits(x), x.budget_left === null ? "–" : `${x.budget_left}/${x.budget}`,
    x.next_eligible ? new Date(x.next_eligible * 1000).toLocaleTimeString() : "–",
    el("td", x.blocked_until ? `until ${new Date(x.blocked_until * 1000).toLocaleTimeString()} ${x.block_reason || ""}`
      : "", "wrap")]);
}

async function refresh() {
  try {
    const res = await fetch(api("/api/dashboard"), { credentials: "same-origin", cache: "no-store" });
    if (!res.ok) throw new Error((await res.json()).error || res.statusText);
    render(await res.json());
    refreshes += 1;
    const updated = $("updated");
    updated.dataset.refreshes = String(refreshes);
    updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    $("health").className = "dot up";
  } catch (err) {
    $("health").className = "dot down";
    $("updated").textContent = `unreachable: ${err.message}`;
  }
}

async function start() {
  try {
    session = await (await fetch(api("/api/session"), { credentials: "same-origin" })).json();
  } catch (err) { /* read-only */ }
  $("mode").textContent = session.actions ? `signed in as ${session.user}: actions enabled`
    : "read-only (start with --auth for actions)";
  const served = session.namespaces || [];
  if (served.length > 1) { // links to the other namespaces this server serves
    $("namespaces").replaceChildren(...served.map((ns) => {
      const link = el("a", ns);
      link.href = `?namespace=${encodeURIComponent(ns)}`;
      return link;
    }));
  }
  $("redrive-all").addEventListener("click", (ev) => act("/api/dead/redrive", { all: true }, ev.target));
  await refresh();
  setInterval(refresh, INTERVAL_MS);
}

start();
