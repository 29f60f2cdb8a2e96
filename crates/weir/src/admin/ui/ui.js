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

function render(live) {
  $("summary").textContent =
    `config v${live.config_version} · up ${live.uptime_seconds} s · ` +
    `${live.connections.open} / ${live.connections.max} connections` +
    (live.draining ? " · DRAINING" : "");
  $("minute-elapsed").textContent = String(live.seconds_into_minute);
  renderRules(live.rules);
  renderPools(live.pools, live.challenge);
  renderReload(live.reload, live.admin_token);
  updates += 1;
  $("updates").textContent = String(updates);
  $("updated").textContent = new Date(live.at_unix_ms).toLocaleTimeString();
}

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
