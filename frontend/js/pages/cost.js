// Cost: GPU-hours and their cost per team over time, at the configured price per GPU-hour (KILN_GPU_PRICES),
// each team's compile-cache hit rate and the compile time it saved over the same window, and how far kiln's
// forecasts for the jobs of that window (start, peak memory, step time, GPU-hours) were from what happened.

import { api, qs } from "../api.js";
import { LineChart, windowRange } from "../chart.js";
import {
  fmtBucket, fmtDuration, fmtForecastAmount, fmtNumber, fmtPercent, h, pageHeader, replace, showError, table, windowPicker,
} from "../dom.js";

/** @type {import("../router.js").Page} */
export async function costPage(root) {
  const { select, filters } = windowPicker("cost-window", "30:day");
  const chartOpts = { time: true, xFormat: fmtBucket, yMin: 0, empty: "No usage in this window" };
  const hoursChart = new LineChart({ id: "gpu-hours", title: "GPU-hours per team", ...chartOpts });
  const costChart = new LineChart({ id: "cost", title: "Cost per team", ...chartOpts });
  const totals = h("div", { id: "cost-totals" });
  const pricesEl = h("div", { id: "prices" });
  const compileEl = h("div", { id: "compile-cache" });
  const forecastsEl = h("div", { id: "forecasts" });
  root.append(
    pageHeader("Cost"),
    filters,
    h("div", { class: "grid two" }, h("section", { class: "card" }, hoursChart.el), h("section", { class: "card" }, costChart.el)),
    h("section", { class: "card", "aria-labelledby": "tot-title" }, h("h2", { id: "tot-title" }, "Totals"), totals),
    h("section", { class: "card", "aria-labelledby": "cc-title" }, h("h2", { id: "cc-title" }, "Compile cache"), compileEl),
    h("section", { class: "card", "aria-labelledby": "fc-title" }, h("h2", { id: "fc-title" }, "Forecasts against what happened"), forecastsEl),
    h("section", { class: "card", "aria-labelledby": "price-title" }, h("h2", { id: "price-title" }, "Prices"), pricesEl),
  );

  const load = async () => {
    const [days, bucket] = select.value.split(":");
    try {
      const data = await api(`/v1/dashboard/cost${qs({ days, bucket })}`);
      const cur = data.currency;
      const money = (/** @type {number} */ v) => `${v.toFixed(2)} ${cur}`;
      for (const chart of [hoursChart, costChart]) { // each bucket drawn across its span, over the whole window
        chart.opts.bucketMs = data.bucket_s * 1000;
        chart.xRange = windowRange(data);
      }
      hoursChart.setSeries(data.series.map((/** @type {any} */ s) => ({ name: s.team, points: s.points.map((/** @type {any} */ p) => [Date.parse(p.t), p.gpu_hours]) })));
      costChart.setSeries(data.series.map((/** @type {any} */ s) => ({ name: s.team, points: s.points.map((/** @type {any} */ p) => [Date.parse(p.t), p.cost]) })));
      replace(totals, table("Totals per team", [
        { title: "Team", cell: (/** @type {any} */ s) => s.team },
        { title: "GPU-hours", cell: (/** @type {any} */ s) => fmtNumber(s.gpu_hours, 3), class: "num" },
        { title: "By type", cell: (/** @type {any} */ s) => Object.entries(s.by_gpu_type).map(([t, v]) => `${t}: ${fmtNumber(Number(v), 3)}`).join(", ") },
        { title: "Cost", cell: (/** @type {any} */ s) => money(s.cost), class: "num" },
      ], data.series, "No usage in this window."));
      // Compiles that reused a team's cache instead of compiling cold, over the same window.
      replace(compileEl, table("Compile-cache reuse per team", [
        { title: "Team", cell: (/** @type {any} */ c) => c.team },
        { title: "Compiles", cell: (/** @type {any} */ c) => c.compiled, class: "num" },
        { title: "Hits", cell: (/** @type {any} */ c) => c.hits, class: "num" },
        { title: "Hit rate", cell: (/** @type {any} */ c) => fmtPercent(c.hit_rate), class: "num" },
        { title: "Time saved", cell: (/** @type {any} */ c) => fmtDuration(c.saved_s), class: "num" },
        { title: "Rejected entries", cell: (/** @type {any} */ c) => c.rejected, class: "num" },
      ], data.compile_cache, "No compile in this window."));
      replace(forecastsEl, forecastTable(data.forecasts), h("p", { class: "help" },
        "Error = measured − forecast (+: later, bigger or slower than forecast); a start's is from its earliest time. Median and p90 are nearest-rank over the measured forecasts."));
      replace(pricesEl, table("Price per GPU-hour", [
        { title: "GPU type", cell: (/** @type {[string, number]} */ p) => (p[0] === "*" ? "any other" : p[0]) },
        { title: `Price (${cur}/h)`, cell: (/** @type {[string, number]} */ p) => p[1].toFixed(2), class: "num" },
      ], Object.entries(data.prices)), h("p", { class: "help" }, "Set with KILN_GPU_PRICES, e.g. {\"H200\": 4.5, \"cpu\": 0.05}."));
    } catch (err) {
      showError(totals, err);
    }
  };
  select.addEventListener("change", load);
  await load();
}

/** How far the forecasts of each kind and source were from what the jobs measured (GET /v1/usage's `forecasts`).
 * @param {any[]} rows */
function forecastTable(rows) {
  const err = (/** @type {string} */ key, signed = false) => (/** @type {any} */ e) => fmtForecastAmount(e[key], e.unit, signed);
  return table("Forecast errors per kind", [
    { title: "Kind", cell: (/** @type {any} */ e) => (e.kind === "gpu_hours" ? "GPU-hours" : e.kind.replace("_", " ")) },
    { title: "Source", cell: (/** @type {any} */ e) => e.source },
    { title: "Made", cell: (/** @type {any} */ e) => e.forecasts, class: "num" },
    { title: "Unknown", cell: (/** @type {any} */ e) => e.unknown, class: "num" },
    { title: "Measured", cell: (/** @type {any} */ e) => e.measured, class: "num" },
    { title: "Median |error|", cell: err("median_abs_error"), class: "num" },
    { title: "p90 |error|", cell: err("p90_abs_error"), class: "num" },
    { title: "Median error", cell: err("median_error", true), class: "num" },
    { title: "Median relative", cell: (/** @type {any} */ e) => fmtPercent(e.median_rel_error), class: "num" },
    { title: "p90 relative", cell: (/** @type {any} */ e) => fmtPercent(e.p90_rel_error), class: "num" },
    { title: "In range", cell: (/** @type {any} */ e) => (e.in_range === null ? "—" : `${e.in_range}/${e.measured}`), class: "num" },
  ], rows, "No forecast made in this window.");
}
