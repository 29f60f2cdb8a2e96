// weir's live page: renders each `live` event of /ui/events (server-sent
// events, one a second). Everything is written with textContent: rule names,
// prefixes and reload errors are data, never markup.
"use strict";

const $ = (id) => document.getElementById(id);
let updates = 0;
// The previous document's lane counters, and each lane's mean wait over the
// last interval in which it admitted anyone (kept until the next such).
let previousLanes = new Map();
const lastWaitMs = new Map();

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function replaceBody(table, rows, empty) {
  const body = table.tBodies[0];
  body.replaceChildren();
  if (rows.length === 0 && empty) {
    const tr = body.insertRow();
    tr.className = "empty";
    const td = cell(tr, empty);
    td.colSpan = table.tHead.rows[0].cells.length;
  }
  for (const fill of rows) fill(body.insertRow());
}

const pct = (part, whole) => (whole > 0 ? Math.round((100 * part) / whole) + "%" : "-");

function renderRules(rules) {
  replaceBody($("rules"), rules.map((r) => (tr) => {
    const now = r.this_minute;
    cell(tr, r.rule);
    cell(tr, String(now.rejections), "num");
    cell(tr, r.last_minute ? String(r.last_minute.rejections) : "-", "num");
    cell(tr, String(now.distinct_clients), "num");
    cell(tr, pct(now.looks_human, now.rejections), now.looks_human > 0 ? "num people" : "num");
    cell(tr, now.top_prefixes.map(([p, n]) => `${p} (${n})`).join(", ") || "-");
  }), "no rule has refused anything this minute");
}

function renderPools(pools, challenge) {
  const engaged = new Map(challenge.map((c) => [c.pool, c.engaged]));
  replaceBody($("pools"), pools.map((p) => (tr) => {
    cell(tr, p.name);
    cell(tr, p.signal, p.signal);
    const a = p.admission;
    cell(tr, a ? `${a.in_flight} / ${a.limit}` : String(p.in_flight), "num");
    cell(tr, a ? a.lanes.map((l) => {
      const shed = Object.values(l.shed_total).reduce((x, y) => x + y, 0);
      const key = p.name + "/" + l.lane;
      const before = previousLanes.get(key);
      previousLanes.set(key, l);
      if (before && l.admitted_total > before.admitted_total) {
        lastWaitMs.set(key, (1000 * (l.waited_seconds_total - before.waited_seconds_total)) /
          (l.admitted_total - before.admitted_total));
      }
      const ms = lastWaitMs.get(key);
      const wait = ms === undefined ? "" : `, waited ${ms.toFixed(0)} ms`;
      return `${l.lane}: ${l.queued} (${l.admitted_total}, ${shed}${wait})`;
    }).join("; ") : "no admission queue");
    cell(tr, p.servers.map((s) => {
      const ms = s.latency_ms == null ? "" : ` ${s.latency_ms.toFixed(0)} ms`;
      return `${s.address} ${s.health}${ms}`;
    }).join("; "));
    const e = engaged.get(p.name);
    cell(tr, e === undefined ? "-" : e ? "engaged" : "calm", e ? "busy" : "");
  }));
}

function renderReload(reload, tokenSet) {
  const p = $("reload");
  if (reload) {
    const at = new Date(reload.at_unix_ms).toLocaleTimeString();
    p.textContent = reload.applied
      ? `reloaded at ${at}: version ${reload.version} serving`
      : `reload refused at ${at} (version ${reload.version} serves on): ${reload.errors.join("; ")}`;
    p.className = reload.applied ? "ready" : "down";
  }
  $("reload-form").hidden = !tokenSet;
  $("read-only").hidden = tokenSet;
}

// ---- The last 15 minutes: inline SVG charts of the timeline's seconds
// (/ui/history once, then each document's `recent` seconds). Bounded: at
// most KEPT seconds are held, as on the server.
const KEPT = 900;
const SVG = "http://www.w3.org/2000/svg";
const W = 900, H = 150, LEFT = 46, RIGHT = 6, TOP = 8, BOTTOM = 18;
let seconds = [];

function merge(incoming) {
  for (const s of incoming) {
    const last = seconds.length ? seconds[seconds.length - 1].at_unix_s : -1;
    if (s.at_unix_s > last) seconds.push(s);
  }
  if (seconds.length > KEPT) seconds = seconds.slice(seconds.length - KEPT);
}

function svgEl(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}

// The smallest of 1, 2, 2.5, 5 times a power of ten at or above `v`.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v * 0.999) return m * p;
  return 10 * p;
}

// A number as the charts label it: whole numbers whole, others to three
// figures at most.
function fmt(v) {
  if (v == null) return "-";
  if (Number.isInteger(v) || v >= 100) return v.toFixed(0);
  return v.toFixed(v >= 10 ? 1 : 2).replace(/\.?0+$/, "");
}

// A count as an axis labels it: 1k, 10k, 1M.
function short(v) {
  if (v >= 1e6) return fmt(v / 1e6) + "M";
  if (v >= 1e3) return fmt(v / 1e3) + "k";
  return fmt(v);
}

// The vertical scale of a chart whose values reach `max`: linear from 0,
// or (`log`) in powers of ten from 0 and 1 up, so that a flood three
// hundred times the people's rate leaves the people's line readable.
// Returns where a value sits and the grid's values.
function scale(max, log) {
  const span = H - TOP - BOTTOM;
  if (log) {
    const decades = Math.max(1, Math.ceil(Math.log10(Math.max(max, 1)) - 1e-9));
    const y = (v) => TOP + span * (1 - Math.log10(1 + Math.min(v, 10 ** decades)) / Math.log10(1 + 10 ** decades));
    return { y, grid: [0, ...Array.from({ length: decades }, (_, k) => 10 ** (k + 1))] };
  }
  const top = niceMax(max);
  return { y: (v) => TOP + span * (1 - Math.min(v, top) / top), grid: [0, top / 2, top] };
}

// Draws `spec` ({series: [{name, color, get}], log, unit, max}) over the
// kept seconds into `figure`: a grid, the axis labels, one polyline per
// series (a second without a value breaks it), and a legend of the latest
// values.
function drawChart(figure, spec) {
  let svg = figure.querySelector("svg.chart");
  if (!svg) {
    svg = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img" }, figure);
    figure.appendChild(document.createElement("ul"));
  }
  svg.replaceChildren();
  const latest = seconds.length ? seconds[seconds.length - 1].at_unix_s : 0;
  const from = latest - (KEPT - 1);
  const x = (at) => LEFT + ((W - LEFT - RIGHT) * (at - from)) / (KEPT - 1);
  const cols = spec.series.map((s) => seconds.map((sec) => [sec.at_unix_s, s.get(sec)]));
  let max = spec.max ?? 0;
  if (spec.max == null) for (const c of cols) for (const [, v] of c) if (v != null && v > max) max = v;
  const { y, grid } = scale(max, spec.log);
  for (const g of grid) {
    svgEl("line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(g), y2: y(g) }, svg);
    svgEl("text", { x: LEFT - 4, y: y(g) + 4, "text-anchor": "end" }, svg).textContent = short(g);
  }
  for (const [min, label] of [[15, "-15 min"], [10, "-10"], [5, "-5"], [0, "now"]]) {
    const at = latest - 60 * min;
    svgEl("text", { x: x(Math.max(at, from)), y: H - 4, "text-anchor": min === 15 ? "start" : min === 0 ? "end" : "middle" }, svg).textContent = label;
  }
  let points = 0;
  cols.forEach((col, i) => {
    let run = [];
    const flush = () => {
      if (run.length > 0) {
        svgEl("polyline", { points: run.join(" "), fill: "none", stroke: spec.series[i].color, "stroke-width": 2.5, "data-series": spec.series[i].name }, svg);
        points += run.length;
      }
      run = [];
    };
    for (const [at, v] of col) {
      if (v == null) flush();
      else run.push(`${x(at).toFixed(1)},${y(v).toFixed(1)}`);
    }
    flush();
  });
  svg.dataset.points = String(points);
  svg.dataset.latest = String(latest);
  const legend = figure.querySelector("ul");
  legend.replaceChildren();
  const last = seconds[seconds.length - 1];
  for (const s of spec.series) {
    const li = document.createElement("li");
    const sw = svgEl("svg", { viewBox: "0 0 10 10" }, li);
    svgEl("rect", { width: 10, height: 10, fill: s.color }, sw);
    li.append(`${s.name} ${last ? fmt(s.get(last)) : "-"}${spec.unit ?? ""}`);
    legend.appendChild(li);
  }
}

const OUTCOMES = [
  ["served", "#2da44e"], ["challenged", "#bf8700"], ["refused", "#cf222e"],
  ["shed", "#8250df"], ["other", "#8c959f"],
];
const STATUSES = [
  ["1xx", "#54aeff"], ["2xx", "#2da44e"], ["3xx", "#0969da"], ["4xx", "#bf8700"], ["5xx", "#cf222e"],
];
const refusals = (s) => s.outcomes.refused + s.outcomes.shed;

const CHARTS = {
  "chart-outcomes": { log: true, series: OUTCOMES.map(([k, color]) => ({ name: k, color, get: (s) => s.outcomes[k] })) },
  "chart-latency": { unit: " ms", series: [
    { name: "p50", color: "#0969da", get: (s) => s.p50_ms },
    { name: "p99", color: "#cf222e", get: (s) => s.p99_ms },
  ] },
  "chart-statuses": { log: true, series: STATUSES.map(([k, color]) => ({ name: k, color, get: (s) => s.statuses[k] })) },
  "chart-people": { unit: "%", max: 100, series: [
    { name: "with evidence of a person", color: "#cf222e", get: (s) => (refusals(s) > 0 ? (100 * s.refused_people) / refusals(s) : null) },
  ] },
};

// Each pool of the latest second gets two charts: its slots (in flight,
// the adaptive limit, waiting) and its queue wait.
function poolSpecs(name) {
  const pool = (s) => s.pools.find((p) => p.pool === name);
  const slots = [
    { name: "in flight", color: "#0969da", get: (s) => pool(s)?.in_flight ?? null },
    { name: "waiting", color: "#bf8700", get: (s) => pool(s)?.queued ?? null },
  ];
  if (seconds.some((s) => pool(s)?.limit != null)) {
    slots.push({ name: "adaptive limit", color: "#57606a", get: (s) => pool(s)?.limit ?? null });
  }
  return [
    [`pool ${name}: in flight, waiting and the adaptive limit`, { series: slots }],
    [`pool ${name}: queue wait of those admitted (ms)`, { unit: " ms", series: [
      { name: "mean wait", color: "#8250df", get: (s) => pool(s)?.wait_ms ?? null },
    ] }],
  ];
}

function renderTimeline() {
  for (const [id, spec] of Object.entries(CHARTS)) drawChart($(id), spec);
  const box = $("pool-charts");
  const names = seconds.length ? seconds[seconds.length - 1].pools.map((p) => p.pool) : [];
  const wanted = names.flatMap(poolSpecs);
  // Figures are kept across updates (only their contents are redrawn).
  const have = new Map([...box.children].map((f) => [f.dataset.title, f]));
  const figures = wanted.map(([title, spec]) => {
    let f = have.get(title);
    if (!f) {
      f = document.createElement("figure");
      f.dataset.title = title;
      const cap = document.createElement("figcaption");
      cap.textContent = title;
      f.appendChild(cap);
    }
    drawChart(f, spec);
    return f;
  });
  box.replaceChildren(...figures);
}

function renderRefused(refused) {
  if (!refused) return;
  const rows = (list) => list.map(([name, n]) => (tr) => {
    cell(tr, name);
    cell(tr, String(n), "num");
  });
  replaceBody($("refused-families"), rows(refused.families), "nothing refused in the last 15 minutes");
  replaceBody($("refused-prefixes"), rows(refused.prefixes), "nothing refused in the last 15 minutes");
}

async function loadHistory() {
  try {
    const r = await fetch("/ui/history", { cache: "no-store" });
    const h = await r.json();
    seconds = [];
    merge(h.seconds);
    renderTimeline();
    renderRefused(h.refused);
  } catch (err) {
    // The stream's documents fill the charts from now on.
  }
}

function render(live) {
  $("summary").textContent =
    `config v${live.config_version} · up ${live.uptime_seconds} s · ` +
    `${live.connections.open} / ${live.connections.max} connections` +
    (live.draining ? " · DRAINING" : "");
  $("minute-elapsed").textContent = String(live.seconds_into_minute);
  merge(live.recent);
  renderTimeline();
  renderRefused(live.refused);
  renderRules(live.rules);
  renderPools(live.pools, live.challenge);
  renderReload(live.reload, live.admin_token);
  updates += 1;
  $("updates").textContent = String(updates);
  $("updated").textContent = new Date(live.at_unix_ms).toLocaleTimeString();
}

loadHistory();
const events = new EventSource("/ui/events");
events.addEventListener("live", (e) => render(JSON.parse(e.data)));
events.onopen = () => { $("stream").textContent = "live"; $("stream").className = "state live"; };
events.onerror = () => { $("stream").textContent = "connection lost: retrying"; $("stream").className = "state lost"; };

$("reload-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const out = $("reload-result");
  out.textContent = "reloading…";
  try {
    const r = await fetch("/reload", {
      method: "POST",
      headers: { Authorization: "Bearer " + $("token").value },
    });
    const body = await r.json();
    out.textContent = body.result + (body.errors ? ": " + body.errors.join("; ") : "");
  } catch (err) {
    out.textContent = "failed: " + err;
  }
});
