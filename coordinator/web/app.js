// The status page: polls /api/status once a second and draws the world, the
// history of the generation, world size and step rate, the events and the
// checkpoint catalog. No build step, no dependencies.
"use strict";

const history = [];  // {t, generation, size, rate, samples_rate}
const HISTORY = 600;
let previous = null;  // {t, step, samples}

// The page's colour classes for a member's state.
function stateClass(s) {
  switch (s) {
    case "active": return "training";
    case "waiting": return "joining";
    case "draining": return "leaving";
    case "failed": return "failed";
    case "spare": return "spare";
    default: return "ended";  // left, finished
  }
}
const LABELS = { training: "training", joining: "joining", leaving: "leaving",
                 failed: "failed / fenced", spare: "spare", ended: "left / finished" };

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function clock(ms) { return new Date(ms).toISOString().slice(11, 19); }
function duration(ms) {
  const s = Math.floor(ms / 1000), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  return h > 0 ? `${h}h${String(m).padStart(2, "0")}m` : `${m}m${String(s % 60).padStart(2, "0")}s`;
}
function bytes(n) {
  const u = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < u.length - 1) { n /= 1000; ++i; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function drawWorld(status) {
  const byNode = new Map();
  for (const m of status.members) {
    if (!byNode.has(m.node)) byNode.set(m.node, []);
    byNode.get(m.node).push(m);
  }
  const body = el("tbody");
  for (const node of [...byNode.keys()].sort()) {
    const cells = el("td");
    const members = byNode.get(node).sort((a, b) => a.local_rank - b.local_rank);
    for (const m of members) {
      const cls = stateClass(m.state);
      const rank = m.rank >= 0 ? `rank ${m.rank}` : m.state;
      const cell = el("span", { class: `cell ${cls}`, "data-member": m.id, "data-state": cls,
                                title: `${m.id} (${m.state}) step ${m.step}` +
                                       (m.reason ? `: ${m.reason}` : "") },
                      `${m.local_rank} · `, el("small", {}, `${rank} · ${m.step}`));
      cells.append(cell);
    }
    body.append(el("tr", {}, el("th", {}, node), cells));
  }
  document.querySelector("#world tbody").replaceWith(body);
}

function drawLegend() {
  const legend = document.getElementById("legend");
  for (const [cls, label] of Object.entries(LABELS)) {
    legend.append(el("span", { class: `cell ${cls}` }, label), " ");
  }
}

function polyline(svg, points, key, max) {
  if (points.length < 2) return;
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const xs = (t) => ((t - t0) / Math.max(1, t1 - t0)) * 600;
  const ys = (v) => 155 - (v / Math.max(1, max)) * 145;
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("class", key);
  line.setAttribute("points", points.map((p) => `${xs(p.t).toFixed(1)},${ys(p[key]).toFixed(1)}`).join(" "));
  svg.append(line);
}

function drawCharts() {
  const world = document.getElementById("chart-world");
  const rate = document.getElementById("chart-rate");
  const samples = document.getElementById("chart-samples");
  world.replaceChildren();
  rate.replaceChildren();
  samples.replaceChildren();
  const top = Math.max(...history.map((p) => Math.max(p.generation, p.size)));
  polyline(world, history, "generation", top);
  polyline(world, history, "size", top);
  polyline(rate, history, "rate", Math.max(...history.map((p) => p.rate)));
  polyline(samples, history, "samples_rate", Math.max(...history.map((p) => p.samples_rate)));
}

function drawEvents(status) {
  const list = el("ol", { id: "events" });
  for (const e of [...status.events].reverse()) {
    list.append(el("li", { "data-kind": e.kind },
                   el("time", {}, clock(e.unix_ms)), el("span", { class: `kind ${e.kind}` }, e.kind),
                   e.detail));
  }
  document.getElementById("events").replaceWith(list);
}

function drawCheckpoints(status) {
  const body = el("tbody");
  for (const c of [...status.checkpoints].reverse()) {
    body.append(el("tr", { class: c.state },
                   el("td", {}, String(c.id)), el("td", {}, String(c.step)),
                   el("td", {}, String(c.generation)), el("td", {}, c.state),
                   el("td", {}, String(c.world_size)),
                   el("td", {}, c.state === "committed" || c.state === "retired" ? clock(c.committed_unix_ms) : "–"),
                   el("td", {}, bytes(c.bytes))));
  }
  document.querySelector("#checkpoints tbody").replaceWith(body);
}

async function poll() {
  let status;
  try {
    const r = await fetch("/api/status", { credentials: "same-origin", cache: "no-store" });
    if (r.status === 401) { location.assign("/login"); return; }
    status = await r.json();
  } catch (e) {
    document.getElementById("summary").textContent = `coordinator unreachable (${e.message})`;
    return;
  }
  const active = status.members.filter((m) => m.state === "active");
  const step = active.reduce((s, m) => Math.max(s, m.step), 0);
  // Every member reports its world's samples so far: the job's, not its own share.
  const sampled = active.reduce((s, m) => Math.max(s, m.samples || 0), 0);
  const t = status.now_unix_ms;
  let rate = 0, samplesRate = 0;
  if (previous && t > previous.t && step >= previous.step) rate = (step - previous.step) * 1000 / (t - previous.t);
  if (previous && t > previous.t && sampled >= previous.sampled) {
    samplesRate = (sampled - previous.sampled) * 1000 / (t - previous.t);
  }
  previous = { t, step, sampled };
  history.push({ t, generation: status.generation, size: status.world_size, rate,
                 samples_rate: samplesRate });
  if (history.length > HISTORY) history.shift();
  document.getElementById("summary").textContent =
    `job ${status.job_state} · generation ${status.generation} · world ${status.world_size} ` +
    `(min ${status.min_members}, max ${status.max_members}) · step ${step} · ${rate.toFixed(1)} steps/s · ` +
    `${samplesRate.toFixed(0)} samples/s · ` +
    `${status.committed_checkpoints} checkpoints` +
    (status.latest_committed_step >= 0 ? ` (latest step ${status.latest_committed_step})` : "") +
    ` · up ${duration(status.uptime_ms)}`;
  drawWorld(status);
  drawCharts();
  drawEvents(status);
  drawCheckpoints(status);
}

drawLegend();
poll();
setInterval(poll, 1000);
