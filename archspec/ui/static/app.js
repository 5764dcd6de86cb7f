// archspec ui: sorting, selection, live updates of RUNNING runs, and uPlot charts. Every value from the registry
// reaches the page through textContent, never parsed as markup: run names and metric keys are data.
"use strict";

const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700", "#bf3989", "#0a3069", "#57606a"];

function fmt(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number") return String(v);
  if (Math.abs(v) >= 1000) {
    for (const [u, d] of [["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]]) {
      if (Math.abs(v) >= d) return (v / d).toFixed(2) + u;
    }
  }
  if (Number.isInteger(v)) return String(v);
  if (Math.abs(v) >= 1e-3) return String(Number(v.toPrecision(4)));
  return v.toExponential(3);
}

// ── runs page ──

function setupRunsPage() {
  const table = document.getElementById("runs");
  if (!table) return;
  const form = document.getElementById("filters");
  for (const link of document.querySelectorAll("a.sort")) {
    link.addEventListener("click", (event) => {
      event.preventDefault();
      const sort = document.getElementById("sort");
      const field = link.dataset.field;
      sort.value = sort.value === "-" + field ? field : "-" + field;
      form.submit();
    });
  }
  const picked = () => [...document.querySelectorAll("input.pick:checked")].map((box) => box.value);
  document.getElementById("compare-selected").addEventListener("click", () => {
    const ids = picked();
    if (ids.length >= 2) window.location.href = "/compare?ids=" + encodeURIComponent(ids.join(","));
  });
  document.getElementById("chart-selected").addEventListener("click", () => {
    const ids = picked();
    if (!ids.length) return;
    document.getElementById("chart-section").hidden = false;
    setupChart(ids);
  });
  if (table.querySelector('tr[data-status="RUNNING"]')) setTimeout(() => refreshRuns(table), 3000);
}

async function refreshRuns(table) {
  // Live updates: while a run on the page is RUNNING, poll the JSON endpoint with the page's own query and update
  // status, steps and columns in place.
  const params = new URLSearchParams(window.location.search);
  params.set("limit", String(table.tBodies[0].rows.length || 1));
  try {
    const response = await fetch("/api/runs?" + params.toString());
    if (!response.ok) return;
    const data = await response.json();
    const byId = new Map(data.runs.map((r) => [r.id, r]));
    let running = false;
    for (const row of table.tBodies[0].rows) {
      const run = byId.get(row.dataset.run);
      if (!run) continue;
      row.dataset.status = run.status;
      const status = row.querySelector("td.status");
      status.textContent = run.status + (run.stale ? " (stale)" : "");
      status.className = "status " + run.status.toLowerCase();
      row.querySelector("td.steps").textContent = fmt(run.steps);
      const cells = row.querySelectorAll("td.col");
      data.columns.forEach((c, i) => { if (cells[i]) cells[i].textContent = fmt(run.columns[c]); });
      running = running || run.status === "RUNNING";
    }
    if (running) setTimeout(() => refreshRuns(table), 3000);
  } catch (err) {
    setTimeout(() => refreshRuns(table), 10000);
  }
}

// ── charts ──

function smooth(values, alpha) {
  if (!alpha) return values;
  let last = null;
  return values.map((v) => {
    if (v === null) return null;
    last = last === null ? v : alpha * last + (1 - alpha) * v;
    return last;
  });
}

async function fetchSeries(ids, key) {
  const out = [];
  for (const id of ids) {
    const response = await fetch("/api/runs/" + encodeURIComponent(id) + "/metrics/" + encodeURIComponent(key));
    if (response.ok) out.push(await response.json());
  }
  return out;
}

let chartState = { ids: [], wired: false, draw: null };

function chartKeys() {
  // Several metrics, one panel each: a <select multiple> (the run page) or a comma-separated list.
  const el = document.getElementById("chart-key");
  if (el.tagName === "SELECT") return [...el.selectedOptions].map((o) => o.value);
  return el.value.split(",").map((k) => k.trim()).filter((k) => k);
}

function panel(holder, key) {
  const box = document.createElement("div");
  box.className = "panel";
  const title = document.createElement("h3");
  title.textContent = key;  // a metric key is data: textContent
  box.appendChild(title);
  holder.appendChild(box);
  return box;
}

function note(box, text) {
  const p = document.createElement("p");
  p.textContent = text;
  box.appendChild(p);
}

async function drawChart() {
  const holder = document.getElementById("chart");
  const { ids } = chartState;
  const xKind = document.getElementById("chart-x").value;
  const logx = document.getElementById("chart-logx").checked;
  const logy = document.getElementById("chart-logy").checked;
  const alpha = Number(document.getElementById("chart-smooth").value);
  const keys = chartKeys();
  const drawn = [];
  for (const key of keys) drawn.push([key, (await fetchSeries(ids, key)).filter((s) => s.value.length)]);
  holder.replaceChildren();
  holder.dataset.series = String(drawn.reduce((n, [, series]) => n + series.length, 0));
  holder.dataset.points = String(drawn.reduce((n, [, series]) => n + series.reduce((m, s) => m + s.value.length, 0), 0));
  for (const [key, series] of drawn) {
    const box = panel(holder, key);
    if (!series.length) { note(box, "no points for " + key); continue; }
    // One x axis for all: the union of every run's x values; a run without a point at some x has a gap there.
    // A run whose row cannot say its tokens or FLOPs (a damaged recipe) stays on steps.
    const xsOf = (s) => (xKind === "tokens" && s.tokens ? s.tokens : xKind === "flops" && s.flops ? s.flops : s.step);
    const xs = [...new Set(series.flatMap(xsOf))].sort((a, b) => a - b).filter((x) => !logx || x > 0);
    const index = new Map(xs.map((x, i) => [x, i]));
    const data = [xs];
    for (const s of series) {
      const column = new Array(xs.length).fill(null);
      xsOf(s).forEach((x, i) => { if (index.has(x)) column[index.get(x)] = s.value[i]; });
      data.push(smooth(column, alpha).map((v) => (logy && v !== null && v <= 0 ? null : v)));
    }
    const options = {
      width: Math.max(400, holder.clientWidth || 900), height: 260,
      scales: { x: { time: false, distr: logx ? 3 : 1 }, y: { distr: logy ? 3 : 1 } },
      series: [{ label: xKind }, ...series.map((s, i) => ({
        label: s.name + " " + s.run, stroke: COLORS[i % COLORS.length], spanGaps: true, value: (u, v) => fmt(v),
      }))],
      axes: [{ label: xKind }, { label: key }],
    };
    new uPlot(options, data, box);
  }
}

// ── a sweep's curves: one per variant, the mean over seeds and its 95% band, the verdict in the legend ──

async function drawSweepChart() {
  const controls = document.getElementById("sweep-chart-controls");
  const holder = document.getElementById("chart");
  const sweep = JSON.parse(controls.dataset.sweep);
  const budget = JSON.parse(controls.dataset.budget);
  const logy = document.getElementById("chart-logy").checked;
  const params = new URLSearchParams();
  if (budget) params.set("budget", budget);
  const keys = chartKeys();
  for (const key of keys) params.append("curves", key);
  const response = await fetch("/api/sweeps/" + encodeURIComponent(sweep) + "?" + params.toString());
  holder.replaceChildren();
  if (!response.ok) { note(holder, "no curves: " + response.status); return; }
  const groups = (await response.json()).groups;
  let drawnSeries = 0;
  for (const key of keys) {
    const box = panel(holder, key);
    const variants = (groups[key] || []).filter((g) => g.step.length);
    if (!variants.length) { note(box, "no points for " + key); continue; }
    const xs = [...new Set(variants.flatMap((g) => g.step))].sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const data = [xs];
    const series = [{ label: "step" }];
    const bands = [];
    variants.forEach((g, i) => {
      const color = COLORS[i % COLORS.length];
      const cols = ["mean", "high", "low"].map((what) => {
        const column = new Array(xs.length).fill(null);
        g.step.forEach((x, j) => { column[index.get(x)] = g[what][j]; });
        return column.map((v) => (logy && v !== null && v <= 0 ? null : v));
      });
      const verdict = g.verdict === "baseline" ? "baseline" : g.verdict + (g.ci && g.ci !== "-" ? " " + g.delta + " " + g.ci : "");
      const base = data.length;
      data.push(cols[0], cols[1], cols[2]);
      series.push({ label: g.row + " " + g.label + " · " + verdict + " (" + g.seeds + " seeds)", stroke: color,
                    width: 2, spanGaps: true, value: (u, v) => fmt(v) },
                  { label: "95% high", stroke: color, width: 0.5, dash: [4, 4], spanGaps: true, value: (u, v) => fmt(v) },
                  { label: "95% low", stroke: color, width: 0.5, dash: [4, 4], spanGaps: true, value: (u, v) => fmt(v) });
      bands.push({ series: [base + 1, base + 2], fill: color + "22" });
      drawnSeries += 1;
    });
    const options = {
      width: Math.max(400, holder.clientWidth || 900), height: 280, bands,
      scales: { x: { time: false }, y: { distr: logy ? 3 : 1 } },
      series, axes: [{ label: "step" }, { label: key }],
    };
    new uPlot(options, data, box);
  }
  holder.dataset.series = String(drawnSeries);
}

function setupSweepChart() {
  const controls = document.getElementById("sweep-chart-controls");
  if (!controls) return;
  for (const id of ["chart-key", "chart-logy"]) document.getElementById(id).addEventListener("change", drawSweepChart);
  drawSweepChart();
}

function setupChart(ids) {
  chartState.ids = ids;
  if (!chartState.wired) {  // once: a second "chart selected" redraws, it does not add listeners
    for (const id of ["chart-key", "chart-x", "chart-logx", "chart-logy", "chart-smooth"]) {
      const el = document.getElementById(id);
      if (el) el.addEventListener("change", drawChart);
    }
    chartState.wired = true;
  }
  drawChart();
}

function setupPageChart() {
  const controls = document.getElementById("run-chart-controls");
  if (controls) setupChart(JSON.parse(controls.dataset.runs));
}

document.addEventListener("DOMContentLoaded", () => {
  setupRunsPage();
  setupPageChart();
  setupSweepChart();
});
