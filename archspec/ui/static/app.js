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

let chartState = { ids: [], wired: false };

async function drawChart() {
  const holder = document.getElementById("chart");
  const { ids } = chartState;
  const key = document.getElementById("chart-key").value;
  const xKind = document.getElementById("chart-x").value;
  const logx = document.getElementById("chart-logx").checked;
  const logy = document.getElementById("chart-logy").checked;
  const alpha = Number(document.getElementById("chart-smooth").value);
  const series = (await fetchSeries(ids, key)).filter((s) => s.value.length);
  holder.replaceChildren();
  holder.dataset.series = String(series.length);
  holder.dataset.points = String(series.reduce((n, s) => n + s.value.length, 0));
  if (!series.length) {
    const note = document.createElement("p");
    note.textContent = "no points for " + key;
    holder.appendChild(note);
    return;
  }
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
    width: Math.max(400, holder.clientWidth || 900), height: 320,
    scales: { x: { time: false, distr: logx ? 3 : 1 }, y: { distr: logy ? 3 : 1 } },
    series: [{ label: xKind }, ...series.map((s, i) => ({
      label: s.name + " " + s.run, stroke: COLORS[i % COLORS.length], spanGaps: true, value: (u, v) => fmt(v),
    }))],
    axes: [{ label: xKind }, { label: key }],
  };
  new uPlot(options, data, holder);
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
});
