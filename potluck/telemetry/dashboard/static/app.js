// potluck dashboard: renders /api/v1/state, live from /api/v1/stream (server-sent events).
// Every string that comes from a peer is set with textContent, never parsed as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STATES = ["contributing", "syncing", "joining", "spare", "stale", "unreachable", "leaving", "offline"];
const PARTS = ["compute", "send", "recv", "allreduce", "idle"];
const charts = {};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

const short = (id) => (id ? id.slice(-8) : "");
const dot = (state) => el("span", { class: `dot s-${state}`, title: state });
function duration(s) {
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function human(n, unit) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const k = ["", "k", "M", "G", "T", "P", "E"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < k.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(n < 10 && i > 0 ? 2 : i > 0 ? 1 : 0)} ${k[i]}${unit}`;
}

function renderHeader(s) {
  $("swarm").textContent = s.swarm;
  const j = s.job;
  if (!j) return;
  const loss = j.loss === null ? "–" : j.loss.toFixed(4);
  const eta = j.eta_s === null || j.eta_s === undefined ? "" : ` · ETA ${duration(j.eta_s)}`;
  // A waiting job says what it waits for ("waiting for peers: 3 live, 4 needed to hold the model").
  const why = j.state === "waiting" && j.reason ? ` (${j.reason})` : "";
  $("job").textContent =
    `job ${j.name} · ${j.state}${why} · step ${j.step} / ${j.steps} · loss ${loss} · ${human(j.tokens_per_s, "tok/s")}${eta}`;
  $("epoch").textContent = j.epoch === null ? "" : `epoch ${j.epoch}`;
}

function renderCounts(s) {
  const box = $("counts");
  box.replaceChildren();
  for (const st of STATES) {
    const n = s.counts[st] || 0;
    if (n || st === "contributing" || st === "offline") box.append(el("div", { class: "count" }, dot(st), el("b", {}, n), st));
  }
}

function renderPlan(s) {
  const box = $("stage-grid");
  const plan = s.plan;
  if (!plan || !plan.stages.length) { box.replaceChildren(el("p", { class: "muted" }, "no plan yet")); return; }
  const replicas = Math.max(...plan.stages.map((st) => st.replicas.length));
  const head = el("tr", {}, el("th", {}, "stage"), el("th", {}, "layers"));
  for (let r = 0; r < replicas; r++) head.append(el("th", {}, `replica ${r}`));
  const table = el("table", { id: "stage-table" }, el("thead", {}, head));
  const body = el("tbody");
  for (const st of plan.stages) {
    const row = el("tr", {}, el("td", {}, st.stage), el("td", {}, st.layers));
    for (const rep of st.replicas) {
      const util = rep.utilisation === null ? 0 : Math.round(rep.utilisation * 100);
      const cell = el("td", { class: "peer", "data-state": rep.state },
        el("div", { class: "mono", title: rep.peer }, dot(rep.state), short(rep.peer)),
        el("div", { class: "muted" }, rep.device || ""),
        el("div", { class: "util", title: `compute ${util}% of its last step` }, el("div", { style: `width:${util}%` })));
      row.append(cell);
    }
    body.append(row);
  }
  table.append(body);
  box.replaceChildren(table);
  const spares = $("spares");
  spares.replaceChildren(...plan.spares.map((sp) => el("div", {}, "spare ", el("span", { class: "mono", title: sp.peer }, short(sp.peer)), `: ${sp.reason}`)));
}

function chart(id, label, xs, ys, color) {
  const target = $(id);
  const points = ys.filter((y) => y !== null).length;
  target.setAttribute("data-points", String(points));
  if (typeof uPlot === "undefined") return;
  const width = Math.max(300, target.clientWidth || 400);
  const data = [xs, ys];
  if (!charts[id]) {
    const opts = {
      width, height: 200, legend: { show: false },
      scales: { x: { time: id !== "loss-chart" } },
      series: [{}, { label, stroke: color, width: 2, spanGaps: true }],
      axes: [{ label: id === "loss-chart" ? "step" : "" },
        { size: 64, values: (u, vals) => vals.map((v) => (id === "loss-chart" ? v.toFixed(2) : human(v, ""))) }],
    };
    charts[id] = new uPlot(opts, data, target);
  } else {
    charts[id].setData(data);
  }
}

function renderCharts(s) {
  const t = s.series;
  chart("loss-chart", "loss", t.step, t.loss, "#c53030");
  chart("tps-chart", "tokens/s", t.t, t.tokens_per_s, "#2b6cb0");
  chart("bytes-chart", "bytes/step", t.t, t.bytes_per_step, "#2f855a");
}

function renderContribution(s) {
  const peers = [...s.peers].sort((a, b) => b.tokens_contributed - a.tokens_contributed);
  const top = Math.max(1, ...peers.map((p) => p.tokens_contributed));
  $("contribution").replaceChildren(...peers.map((p) => el("div", { class: "bar" },
    el("span", { class: "mono", title: p.id, style: "width:6rem" }, dot(p.state), short(p.id)),
    el("div", { class: "fill", style: `width:${Math.round((200 * p.tokens_contributed) / top)}px` }),
    el("span", { class: "muted" }, `${human(p.tokens_contributed, "tok")} · ${human(p.flops_contributed, "FLOP")}`))));
}

function renderLinks(s) {
  const box = $("links");
  if (!s.links.length) return;
  const ids = [...new Set(s.links.flatMap((l) => [l.src, l.dst]))].sort();
  const index = new Map(ids.map((id, i) => [id, i]));
  const cell = 18;
  const canvas = el("canvas", { class: "heat", width: cell * ids.length, height: cell * ids.length });
  const ctx = canvas.getContext("2d");
  const max = Math.log10(1 + Math.max(...s.links.map((l) => l.mb_s)));
  const byCell = new Map();
  for (const l of s.links) {
    const x = index.get(l.dst), y = index.get(l.src);
    const v = Math.log10(1 + l.mb_s) / (max || 1);
    ctx.fillStyle = `hsl(${Math.round(10 + 110 * v)}, 65%, ${l.measured ? 45 : 70}%)`;
    ctx.fillRect(x * cell, y * cell, cell - 1, cell - 1);
    byCell.set(`${x},${y}`, l);
  }
  canvas.addEventListener("mousemove", (e) => {
    const x = Math.floor(e.offsetX / cell), y = Math.floor(e.offsetY / cell);
    const l = byCell.get(`${x},${y}`);
    canvas.title = l ? `${short(l.src)} → ${short(l.dst)}: ${l.mb_s.toFixed(1)} MB/s, ${l.rtt_ms.toFixed(1)} ms${l.measured ? "" : " (estimated)"}` : "";
  });
  const legend = el("div", { class: "muted" }, `rows: from, columns: to (${ids.length} peers, ${s.links.length} links; green is fast)`);
  box.replaceChildren(canvas, legend);
}

function split(timing) {
  const bar = el("div", { class: "split" });
  if (!timing || !timing.total) return bar;
  for (const part of PARTS) {
    const w = (100 * (timing[part] || 0)) / timing.total;
    bar.append(el("div", { class: `p-${part}`, style: `width:${w}%`, title: `${part} ${(timing[part] || 0).toFixed(3)} s` }));
  }
  return bar;
}

function renderPeers(s) {
  const head = el("tr", {}, ...["peer", "state", "stage", "step", "tokens/s", "step time (compute · send · recv · all-reduce · idle)", "sent", "memory", "heard"].map((h) => el("th", {}, h)));
  const rows = s.peers.map((p) => el("tr", { "data-peer": p.id },
    el("td", { class: "mono", title: p.id }, short(p.id), el("div", { class: "muted" }, p.device)),
    el("td", {}, dot(p.state), p.state, p.message ? el("div", { class: "muted" }, p.message) : "",
      p.last_abort ? el("div", { class: "abort" }, `last abort: ${p.last_abort}`) : ""),
    el("td", {}, p.stage === null ? "–" : `${p.stage} / ${p.replica}`),
    el("td", {}, p.step),
    el("td", {}, human(p.tokens_per_s, "")),
    el("td", {}, split(p.timing), p.timing ? el("div", { class: "muted" }, `${p.timing.total.toFixed(3)} s`) : ""),
    el("td", {}, human(p.bytes_sent, "B")),
    el("td", {}, human(p.memory_bytes, "B")),
    el("td", {}, `${p.heard_s_ago} s ago`)));
  $("peers").replaceChildren(el("table", { id: "peer-table" }, el("thead", {}, head), el("tbody", {}, ...rows)));
}

function renderEvents(s) {
  $("events").replaceChildren(...s.events.slice(0, 60).map((e) => el("li", {},
    el("span", { class: "muted" }, new Date(e.at * 1000).toLocaleTimeString()), " ",
    el("b", {}, e.kind), " ", el("span", { class: "mono", title: e.peer }, short(e.peer)), " ", e.detail)));
  const t = s.telemetry;
  $("telemetry").textContent = `${t.messages} telemetry messages, ${t.rejected} refused${t.why ? ` (last: ${t.why})` : ""}`;
}

function renderJobs(s) {
  // Several jobs on one swarm: each job's leased peers, the policy's share and the share received.
  const jobs = s.jobs || [];
  $("jobs-card").hidden = jobs.length === 0;
  if (!jobs.length) return;
  $("lease").textContent = s.lease ? `round ${s.lease.round}` : "";
  const head = el("tr", {}, ...["job", "step", "weight", "leased peers", "allocation", "received"].map((h) => el("th", {}, h)));
  const body = el("tbody");
  for (const j of jobs) {
    const peers = el("td", { class: "mono" }, j.peers.length ? j.peers.map(short).join(", ") : "none");
    body.append(el("tr", {}, el("td", {}, j.own ? `${j.job} (own)` : j.job), el("td", {}, `${j.step} / ${j.steps}`),
      el("td", {}, j.weight), peers, el("td", {}, j.allocation.toFixed(2)), el("td", {}, j.received.toFixed(2))));
  }
  $("jobs").replaceChildren(el("table", { id: "jobs-table" }, el("thead", {}, head), body));
}

function render(s) {
  renderHeader(s);
  renderCounts(s);
  renderPlan(s);
  renderJobs(s);
  renderCharts(s);
  renderContribution(s);
  renderLinks(s);
  renderPeers(s);
  renderEvents(s);
  document.body.setAttribute("data-updated", String(s.at));
}

function connect() {
  const live = $("live");
  const source = new EventSource("/api/v1/stream");
  source.onmessage = (m) => { live.classList.add("on"); render(JSON.parse(m.data)); };
  source.onerror = () => { live.classList.remove("on"); };  // EventSource reconnects by itself
}

window.addEventListener("DOMContentLoaded", () => {
  fetch("/api/v1/state").then((r) => r.json()).then(render).catch(() => {});
  connect();
});
