// Cost: GPU-hours and their cost per team over time, at the configured price per GPU-hour (KILN_GPU_PRICES), and
// each team's compile-cache hit rate and the compile time it saved over the same window.

import { api, qs } from "../api.js";
import { LineChart } from "../chart.js";
import {
  fmtBucket, fmtDuration, fmtNumber, fmtPercent, h, pageHeader, replace, showError, table, windowPicker,
} from "../dom.js";

/** @type {import("../router.js").Page} */
export async function costPage(root) {
  const { select, filters } = windowPicker("cost-window", "30:day");
  const hoursChart = new LineChart({ id: "gpu-hours", title: "GPU-hours per team", xFormat: fmtBucket, yMin: 0, empty: "No usage in this window" });
  const costChart = new LineChart({ id: "cost", title: "Cost per team", xFormat: fmtBucket, yMin: 0, empty: "No usage in this window" });
  const totals = h("div", { id: "cost-totals" });
  const pricesEl = h("div", { id: "prices" });
  const compileEl = h("div", { id: "compile-cache" });
  root.append(
    pageHeader("Cost"),
    filters,
    h("div", { class: "grid two" }, h("section", { class: "card" }, hoursChart.el), h("section", { class: "card" }, costChart.el)),
    h("section", { class: "card", "aria-labelledby": "tot-title" }, h("h2", { id: "tot-title" }, "Totals"), totals),
    h("section", { class: "card", "aria-labelledby": "cc-title" }, h("h2", { id: "cc-title" }, "Compile cache"), compileEl),
    h("section", { class: "card", "aria-labelledby": "price-title" }, h("h2", { id: "price-title" }, "Prices"), pricesEl),
  );

  const load = async () => {
    const [days, bucket] = select.value.split(":");
    try {
      const data = await api(`/v1/dashboard/cost${qs({ days, bucket })}`);
      const cur = data.currency;
      const money = (/** @type {number} */ v) => `${v.toFixed(2)} ${cur}`;
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
