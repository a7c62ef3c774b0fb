// kvroute dashboard: subscribes to /v1/stream (Server-Sent Events) and draws the fleet's
// cache state with plain DOM + SVG. No build step, no dependencies, nothing fetched from
// outside the router. Every string from the server goes through textContent (worker and
// request ids are user input).
"use strict";

const MAX_POINTS = 900; // 15 min at one summary per second
const TIERS = ["GPU", "CPU", "STORAGE"];
const TIER_SHORT = { GPU: "GPU", CPU: "CPU", STORAGE: "STO" };
const KIND_SHORT = { full_attention: "full", sliding_window: "swa", mla_attention: "mla", mamba: "mamba" };
const PALETTE = ["#4fb3ff", "#b58cff", "#3ecf8e", "#f5b94a", "#ff6b6b", "#5ce1e6", "#ff9f43", "#c8d6e5"];
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  history: [], // {t, series: {key: value}, events}
  seriesMeta: new Map(), // key -> {label, color}
  workerHistory: new Map(), // worker id -> [total blocks]
  prevWorkers: new Map(), // worker id -> last summary row (for incidents)
  rangeS: 60,
  last: null,
  updates: 0,
};

const $ = (id) => document.getElementById(id);
const fmt = new Intl.NumberFormat("en-US");
const num = (v) => (v === null || v === undefined ? "–" : fmt.format(Math.round(v)));
const rate = (v) => (v >= 100 ? fmt.format(Math.round(v)) : (Math.round(v * 10) / 10).toString());
const clock = (t) => new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function setValue(id, value, text) {
  const node = $(id);
  node.dataset.value = String(value);
  node.textContent = text === undefined ? num(value) : text;
  return node;
}

// ---------------------------------------------------------------- connection
function connect() {
  const conn = $("conn");
  const source = new EventSource("/v1/stream");
  source.addEventListener("open", () => {
    conn.className = "conn conn-live";
    conn.textContent = "live";
  });
  source.addEventListener("error", () => {
    conn.className = source.readyState === EventSource.CLOSED ? "conn conn-down" : "conn conn-wait";
    conn.textContent = source.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting…";
    if (source.readyState === EventSource.CLOSED) setTimeout(connect, 2000);
  });
  source.addEventListener("summary", (msg) => {
    let summary;
    try {
      summary = JSON.parse(msg.data);
    } catch (err) {
      console.error("bad summary", err);
      return;
    }
    update(summary);
  });
}

// ---------------------------------------------------------------- update
function update(s) {
  state.last = s;
  state.updates += 1;
  document.body.dataset.updates = String(state.updates); // tests wait on this
  recordHistory(s);
  renderHeader(s);
  renderKpis(s);
  renderWorkers(s);
  renderChart();
  renderRoutes(s);
  renderErrors(s);
  renderProxy(s);
}

function groupKinds(s) {
  const kinds = {};
  for (const w of s.workers) for (const g of w.groups) if (!(g.group_idx in kinds)) kinds[g.group_idx] = g;
  return kinds;
}

function recordHistory(s) {
  const kinds = groupKinds(s);
  const series = {};
  for (const [g, byMedium] of Object.entries(s.totals.groups || {})) {
    for (const tier of TIERS) {
      if (!(tier in byMedium)) continue;
      const key = `g${g}/${tier}`;
      series[key] = byMedium[tier];
      if (!state.seriesMeta.has(key)) {
        const info = kinds[g] || {};
        let kind = KIND_SHORT[info.kind] || info.kind || "";
        if (info.sliding_window) kind += ` ${info.sliding_window}`;
        state.seriesMeta.set(key, {
          label: `group ${g}${kind ? " (" + kind + ")" : ""} · ${tier}`,
          color: PALETTE[state.seriesMeta.size % PALETTE.length],
          tier,
        });
      }
    }
  }
  state.history.push({ t: s.ts, series, eventRate: s.totals.event_rate });
  if (state.history.length > MAX_POINTS) state.history.shift();
  for (const w of s.workers) {
    const h = state.workerHistory.get(w.worker_id) || [];
    h.push(w.blocks_total);
    if (h.length > 120) h.shift();
    state.workerHistory.set(w.worker_id, h);
  }
}

function renderHeader(s) {
  const idx = s.index;
  const entries = idx.entries === null || idx.entries === undefined ? "" : ` · ${num(idx.entries)} entries`;
  const info = $("index-info");
  info.textContent = `index: ${idx.kind}${idx.up ? "" : " (DOWN)"}${entries}`;
  info.className = idx.up ? "" : "err";
  const up = s.uptime_s;
  $("uptime").textContent = `up ${up >= 3600 ? Math.floor(up / 3600) + "h " : ""}${Math.floor((up % 3600) / 60)}m ${Math.floor(up % 60)}s`;
}

function renderKpis(s) {
  const t = s.totals;
  setValue("workers-connected", t.connected, `${t.connected} / ${t.workers}`);
  setValue("total-gpu", t.blocks.GPU || 0);
  const off = (t.blocks.CPU || 0) + (t.blocks.STORAGE || 0);
  setValue("total-offloaded", off);
  setValue("event-rate", t.event_rate, rate(t.event_rate));
  const sr = $("store-rate");
  sr.dataset.value = String(t.store_rate);
  sr.replaceChildren(rate(t.store_rate), el("small", {}, ` / ${rate(t.remove_rate)}`));
  const gaps = t.gaps + t.replays + t.resyncs;
  setValue("gap-summary", gaps, `${num(t.gaps)} · ${num(t.replays)} · ${num(t.resyncs)}`).className =
    "value" + (t.gaps || t.resyncs ? " warn" : "");
  setValue("decode-errors", t.decode_errors).className = "value" + (t.decode_errors ? " bad" : "");
  drawSpark($("event-spark"), state.history.slice(-60).map((h) => h.eventRate));
}

function drawSpark(svg, values) {
  svg.replaceChildren();
  if (values.length < 2) return;
  const w = 100, h = 24, max = Math.max(1, ...values);
  const d = values
    .map((v, i) => `${i ? "L" : "M"}${((i / (values.length - 1)) * w).toFixed(1)},${(h - 1 - (v / max) * (h - 2)).toFixed(1)}`)
    .join("");
  const path = document.createElementNS(SVG_NS, "path");
  path.setAttribute("d", d);
  svg.classList.add("spark");
  svg.append(path);
}

// ---------------------------------------------------------------- workers
const HASH_MODE = { engine: "engine hashes", canonical: "canonical keys", unknown: "hash mode pending" };

function countCell(value, cls) {
  return el("td", { class: `n ${value ? cls || "" : "zero"}`, "data-value": String(value) }, num(value));
}

function groupsText(groups) {
  if (!groups.length) return "not learned yet";
  return groups
    .map((g) => {
      let kind = KIND_SHORT[g.kind] || g.kind;
      if (g.sliding_window) kind += ` ${g.sliding_window}`;
      return `g${g.group_idx} ${kind}/${g.block_size}`;
    })
    .join(", ");
}

function renderWorkers(s) {
  const body = $("workers");
  const seen = new Set();
  if (!s.workers.length) {
    body.replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: "11" }, "no workers registered (POST /v1/workers)")));
  } else {
    body.querySelector("tr.empty")?.remove();
  }
  for (const w of s.workers) {
    const id = `worker-${w.worker_id}`;
    seen.add(id);
    let row = document.getElementById(id);
    if (!row) {
      row = el("tr", { id, "data-worker": w.worker_id });
      body.append(row);
    }
    const seq = Object.entries(w.last_seq).map(([r, q]) => (Object.keys(w.last_seq).length > 1 ? `r${r}:${q}` : q)).join(" ") || "–";
    const spark = document.createElementNS(SVG_NS, "svg");
    spark.setAttribute("viewBox", "0 0 100 24");
    spark.setAttribute("preserveAspectRatio", "none");
    drawSpark(spark, state.workerHistory.get(w.worker_id) || []);
    const errors = w.decode_errors + w.replay_failures;
    row.dataset.state = w.state;
    row.dataset.blocks = String(w.blocks_total);
    const errorCell = countCell(errors, "err");
    errorCell.title = `${w.decode_errors} undecodable frames, ${w.replay_failures} failed replays`;
    row.replaceChildren(
      el("td", { class: "id", title: `${w.endpoint} · ${HASH_MODE[w.hash_mode] || w.hash_mode}` },
        w.worker_id, el("small", {}, `${w.endpoint} · ${HASH_MODE[w.hash_mode] || w.hash_mode}`)),
      el("td", {}, el("span", { class: `state state-${w.state}` }, w.state)),
      countCell(w.blocks.GPU || 0, "GPU"),
      countCell(w.blocks.CPU || 0, "CPU"),
      countCell(w.blocks.STORAGE || 0, "STORAGE"),
      el("td", { class: "groups" }, groupsText(w.groups)),
      el("td", { class: "n rate", "data-value": String(w.event_rate) }, rate(w.event_rate)),
      el("td", { class: "spark-cell" }, spark),
      el("td", { class: "n seq" }, seq),
      el("td", { class: `n ${w.gaps || w.resyncs ? "nonzero" : ""}`, "data-gaps": String(w.gaps),
                 "data-replays": String(w.replays), "data-resyncs": String(w.resyncs) },
        `${num(w.gaps)} · ${num(w.replays)} · ${num(w.resyncs)}`),
      errorCell,
    );
    noteIncidents(w, s.ts);
  }
  for (const row of Array.from(body.querySelectorAll("tr[id^='worker-']"))) {
    if (!seen.has(row.id)) {
      addIncident(s.ts, `${row.dataset.worker} removed`, "warn");
      state.prevWorkers.delete(row.dataset.worker);
      row.remove();
    }
  }
  $("workers-hint").textContent = s.workers.length ? `${s.workers.length} registered` : "";
}

function noteIncidents(w, ts) {
  const prev = state.prevWorkers.get(w.worker_id);
  state.prevWorkers.set(w.worker_id, w);
  if (!prev) {
    addIncident(ts, `${w.worker_id} ${w.state}`, w.state === "connected" ? "good" : "warn");
    return;
  }
  if (prev.state !== w.state) {
    const cls = w.state === "connected" ? "good" : w.state === "disconnected" || w.state === "conflict" ? "bad" : "warn";
    addIncident(ts, `${w.worker_id} ${prev.state} → ${w.state}`, cls);
  }
  const checks = [
    ["gaps", "gap", "warn"],
    ["replays", "replay", "warn"],
    ["resyncs", "resync", "bad"],
    ["decode_errors", "decode error", "bad"],
    ["replay_failures", "replay failure", "bad"],
  ];
  for (const [field, label, cls] of checks) {
    const d = w[field] - prev[field];
    if (d > 0) addIncident(ts, `${w.worker_id}: ${d} ${label}${d > 1 ? "s" : ""}`, cls);
  }
}

function addIncident(ts, text, cls) {
  const list = $("incidents");
  list.prepend(el("li", { class: cls || "" }, el("time", {}, clock(ts)), text));
  while (list.children.length > 50) list.lastChild.remove();
}

// ---------------------------------------------------------------- chart
// A y axis of whole, round steps: 1, 2, 5 (or 2.5 from 10 up) times a power of ten.
function niceScale(max) {
  const raw = Math.max(1, max / 4);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = 10 * p;
  for (const m of [1, 2, 2.5, 5]) {
    if (m * p >= raw && (m !== 2.5 || p >= 10)) { step = m * p; break; }
  }
  const ticks = Math.max(1, Math.ceil(max / step));
  return { step, ticks, max: step * ticks };
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function renderChart() {
  const chart = $("blocks-chart");
  const width = chart.clientWidth || 800;
  const height = chart.clientHeight || 230;
  chart.setAttribute("viewBox", `0 0 ${width} ${height}`);
  chart.replaceChildren();
  const m = { l: 58, r: 14, t: 10, b: 22 };
  const pw = width - m.l - m.r, ph = height - m.t - m.b;
  const now = state.history.length ? state.history[state.history.length - 1].t : Date.now() / 1000;
  // Until the history fills the range, stretch what there is (at least 10 s wide).
  const first = state.history.length ? state.history[0].t : now;
  const span = Math.min(state.rangeS, Math.max(10, now - first));
  const t0 = now - span;
  const points = state.history.filter((h) => h.t >= t0 - 1);
  let max = 0;
  for (const h of points) for (const v of Object.values(h.series)) max = Math.max(max, v);
  const scale = niceScale(max);
  const yMax = scale.max;
  const x = (t) => m.l + ((t - t0) / span) * pw;
  const y = (v) => m.t + ph - (v / yMax) * ph;

  for (let i = 0; i <= scale.ticks; i++) {
    const v = scale.step * i;
    chart.append(svg("line", { class: "grid-line", x1: m.l, x2: width - m.r, y1: y(v), y2: y(v) }));
    const label = svg("text", { class: "axis-label", x: m.l - 8, y: y(v) + 4, "text-anchor": "end" });
    label.textContent = num(v);
    chart.append(label);
  }
  const step = span <= 20 ? 5 : span <= 60 ? 15 : span <= 300 ? 60 : 180;
  for (let t = Math.ceil(t0 / step) * step; t <= now; t += step) {
    const label = svg("text", { class: "axis-label", x: x(t), y: height - 6, "text-anchor": "middle" });
    label.textContent = clock(t);
    chart.append(label);
  }
  if (points.length < 2) {
    const note = svg("text", { class: "empty-note", x: m.l + pw / 2, y: m.t + ph / 2, "text-anchor": "middle" });
    note.textContent = points.length ? "collecting…" : "waiting for the first summary…";
    chart.append(note);
  }
  const legend = $("blocks-legend");
  legend.replaceChildren();
  const latest = points.length ? points[points.length - 1].series : {};
  for (const [key, meta] of state.seriesMeta) {
    if (points.length >= 2) {
      const line = points.map((h, i) => `${i ? "L" : "M"}${x(h.t).toFixed(1)},${y(h.series[key] || 0).toFixed(1)}`).join("");
      const area = `${line}L${x(points[points.length - 1].t).toFixed(1)},${y(0)}L${x(points[0].t).toFixed(1)},${y(0)}Z`;
      chart.append(svg("path", { class: "area", d: area, fill: meta.color }));
      chart.append(svg("path", { class: "series", d: line, stroke: meta.color, "data-series": key }));
    }
    legend.append(
      el("span", { class: "item", "data-series": key },
        el("span", { class: "swatch", style: `background:${meta.color}` }),
        meta.label + " ", el("b", {}, num(latest[key] || 0))),
    );
  }
}

// ---------------------------------------------------------------- routes and errors
function renderRoutes(s) {
  const body = $("routes");
  if (!s.routes.length) return;
  const newest = body.firstElementChild?.dataset.key;
  const rows = s.routes.slice(0, 10).map((r, i) => {
    const key = `${r.ts}/${r.request_id}`;
    const pct = r.request_tokens ? Math.min(100, (100 * r.hit_tokens) / r.request_tokens) : 0;
    const row = el(
      "tr",
      { "data-key": key, class: newest && i === 0 && key !== newest ? "flash" : "" },
      el("td", {}, clock(r.ts)),
      el("td", { class: "req", title: r.request_id || "" }, r.request_id || "–"),
      el("td", {}, r.worker_id),
      el("td", { class: "hit", "data-hit": String(r.hit_tokens) },
        el("span", { class: "hitbar" },
          el("span", { class: "bar" }, el("i", { style: `width:${pct.toFixed(0)}%` })),
          `${num(r.hit_tokens)} / ${num(r.request_tokens)}`)),
    );
    return row;
  });
  body.replaceChildren(...rows);
}

function renderErrors(s) {
  const e = s.errors;
  const rows = [
    ["gaps", s.totals.gaps],
    ["replays", s.totals.replays],
    ["resyncs", s.totals.resyncs],
    ["decode errors", e.decode_errors],
    ["replay failures", e.replay_failures],
    ["unknown event types", e.unknown_events],
    ["malformed events", e.malformed_events],
    ["stores with unknown parent", e.unknown_parent],
    ["unresolved offload blocks", e.unresolved_blocks],
    ["bad events", e.bad_events],
    ["ingest lag (s)", s.totals.ingest_lag_s],
  ];
  const dl = $("errors");
  dl.replaceChildren();
  for (const [label, value] of rows) {
    dl.append(el("dt", {}, label), el("dd", { class: value ? "nonzero" : "", "data-value": String(value) }, value ? rate(value) : "0"));
  }
}

// Per worker through the OpenAI proxy: live (or why not), routed, estimated hit tokens vs
// the engines' reported cached tokens, share of exact estimates (the accuracy metric).
function renderProxy(s) {
  const p = s.proxy;
  if (!p || !p.workers) return;
  const share = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(0)}%`);
  const rows = Object.entries(p.workers).map(([id, w]) =>
    el("tr", { "data-worker": id, class: w.live ? "" : "down" },
      el("td", {}, id),
      el("td", { title: w.why_not_live || "" }, w.live ? "yes" : "no"),
      el("td", { class: "n" }, num(w.routed)),
      el("td", { class: "n" }, num(w.estimated_tokens)),
      el("td", { class: "n" }, num(w.cached_tokens)),
      el("td", { class: "n" }, share(w.exact_share)),
      el("td", { class: "n" }, num(w.retried_away ?? 0)),
      el("td", { class: "n" }, `${num(w.upstream_errors ?? 0)} / ${num(w.failed_checks ?? 0)}`)),
  );
  if (rows.length) $("proxy").replaceChildren(...rows);
  const out = p.outcomes || {};
  const bad = Object.entries(out).filter(([k]) => k !== "ok").map(([k, n]) => `${k} ${num(n)}`);
  $("proxy-hint").textContent =
    `${num(p.requests)} requests · exact ${share(p.exact_share)}` + (bad.length ? ` · ${bad.join(" · ")}` : "");
}

// ---------------------------------------------------------------- wiring
for (const button of document.querySelectorAll(".range button")) {
  button.addEventListener("click", () => {
    state.rangeS = Number(button.dataset.range);
    for (const b of document.querySelectorAll(".range button")) b.classList.toggle("active", b === button);
    renderChart();
  });
}
window.addEventListener("resize", () => renderChart());
renderChart();
connect();
