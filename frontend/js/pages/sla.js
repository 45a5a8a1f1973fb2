// SLA: attainment per team and QoS class over time, and the violations, each linked to its job.

import { api, qs } from "../api.js";
import { LineChart, windowRange } from "../chart.js";
import { fmtBucket, fmtPercent, h, pageHeader, replace, showError, table, timeEl, windowPicker } from "../dom.js";

/** @type {import("../router.js").Page} */
export async function slaPage(root) {
  const { select, filters } = windowPicker("sla-window", "7:day");
  const chart = new LineChart({
    id: "sla-attainment", title: "SLA attainment (share of jobs that met their contract)",
    yMin: 0, yMax: 1, yFormat: (v) => `${Math.round(v * 100)}%`,
    time: true, xFormat: fmtBucket,
    empty: "No job submitted in this window",
  });
  const totals = h("div", { id: "sla-totals" });
  const violations = h("div", { id: "sla-violations" });
  root.append(
    pageHeader("SLA"),
    filters,
    h("section", { class: "card" }, chart.el,
      h("p", { class: "muted" }, "A job meets its SLA unless it waited past its contract's maximum queue wait, or the SLA "
        + "evaluator recorded a violation (deadline, restarts, recovery time, checkpoints, step time). A job that ran "
        + "and whose pace was never compared (a script that reports no steps, or steps too few or too brief for a "
        + "baseline and a recent window), or ran as a best-effort GPU share (no speed is "
        + "promised to it), is counted as step time unmeasured.")),
    h("section", { class: "card", "aria-labelledby": "att-title" }, h("h2", { id: "att-title" }, "By team and QoS class"), totals),
    h("section", { class: "card", "aria-labelledby": "vio-title" }, h("h2", { id: "vio-title" }, "Violations"), violations),
  );

  const load = async () => {
    const [days, bucket] = select.value.split(":");
    try {
      const data = await api(`/v1/sla/attainment${qs({ days, bucket })}`);
      // Each bucket (an hour or a day) drawn across its span, over the whole window: a 7-day window with jobs on
      // one day is a day-wide segment on a 7-day axis, not a dot.
      chart.opts.bucketMs = data.bucket_s * 1000;
      chart.xRange = windowRange(data);
      chart.setSeries(data.series.map((/** @type {any} */ s) => ({
        name: `${s.team} / ${s.qos}`,
        points: s.points.map((/** @type {any} */ p) => [Date.parse(p.t), p.attainment]),
      })));
      replace(totals, table("Attainment by team and QoS class", [
        { title: "Team", cell: (/** @type {any} */ s) => s.team },
        { title: "QoS", cell: (/** @type {any} */ s) => s.qos },
        { title: "Jobs", cell: (/** @type {any} */ s) => s.jobs, class: "num" },
        { title: "Met", cell: (/** @type {any} */ s) => s.met, class: "num" },
        { title: "Step time unmeasured", cell: (/** @type {any} */ s) => s.step_time_unmeasured ?? 0, class: "num" },
        { title: "Attainment", cell: (/** @type {any} */ s) => h("span", { class: s.attainment < 0.99 ? "bad" : "ok" }, fmtPercent(s.attainment)), class: "num" },
      ], data.series, "No job in this window."));
      replace(violations, table("SLA violations", [
        { title: "When", cell: (/** @type {any} */ v) => timeEl(v.at) },
        { title: "Job", cell: (/** @type {any} */ v) => h("a", { href: `#/jobs/${v.job_id}` }, `${v.job} #${v.job_id}`) },
        { title: "Team", cell: (/** @type {any} */ v) => v.team },
        { title: "QoS", cell: (/** @type {any} */ v) => v.qos },
        { title: "What", cell: (/** @type {any} */ v) => v.type },
        { title: "Detail", cell: (/** @type {any} */ v) => v.message },
      ], data.violations, "No violation in this window."));
    } catch (err) {
      showError(totals, err);
    }
  };
  select.addEventListener("change", load);
  await load();
}
