// Sweeps: the sweeps you can see, and for one sweep a chart of its jobs' objective over their steps and a summary
// table of their final metrics, best first by the sweep's objective, sortable by any column (click a heading; again
// to reverse). Refreshed every few seconds, the chosen order kept, so a running sweep fills in as its jobs report.
// "Hold queued", "Release held" and "Cancel sweep" act on the whole sweep in one request, as `kiln hold --sweep`,
// `kiln release --sweep` and `kiln cancel --sweep` do; once the sweep is over they are gone.

import { api } from "../api.js";
import { LineChart } from "../chart.js";
import { fmtNumber, h, pageHeader, replace, showError, stateBadge, table, timeEl, toast } from "../dom.js";

const REFRESH_MS = 5000;

/** @type {import("../router.js").Page} */
export async function sweepsPage(root, params) {
  if (params.id) return sweepPage(root, params.id);
  const body = h("div", { id: "sweeps", "aria-busy": "true" });
  root.append(pageHeader("Sweeps"),
    h("p", { class: "muted" }, "One submission expanded over a grid, a list or random draws of settings: kiln sweep submit FILE (docs/cli.md)."),
    body);
  try {
    const page = await api("/v1/sweeps?limit=50");
    replace(body, table("Sweeps", [
      { title: "Id", cell: (/** @type {any} */ s) => h("a", { href: `#/sweeps/${s.id}` }, String(s.id)), class: "num" },
      { title: "Name", cell: (/** @type {any} */ s) => s.name },
      { title: "Team", cell: (/** @type {any} */ s) => s.team },
      { title: "Varies", cell: (/** @type {any} */ s) => s.keys.join(", ") },
      { title: "Jobs", cell: (/** @type {any} */ s) => `${s.jobs.filter((/** @type {any} */ j) => j.state === "SUCCEEDED").length} / ${s.jobs.length} succeeded`, class: "num" },
      { title: "Best", cell: best },
      { title: "Created", cell: (/** @type {any} */ s) => timeEl(s.created_at) },
    ], page.items, "No sweep yet."),
    page.next_cursor ? h("p", { class: "muted" }, "The 50 newest; kiln sweep ls lists them all.") : null);
  } catch (err) {
    showError(body, err);
  } finally {
    body.setAttribute("aria-busy", "false");
  }
}

/**
 * The sweep's objective and its best job's value of it ("accuracy 0.9861"), or "-" while none has one.
 * @param {any} sweep
 */
function best(sweep) {
  const metric = sweep.objective.metric;
  const top = sweep.jobs[0];
  const value = !top ? null : metric === "loss" ? top.last_loss : top.metrics?.[metric];
  return value === null || value === undefined ? "-" : `${metric} ${fmtNumber(value, 4)}`;
}

/**
 * @typedef {{key: string, title: string, value: (j: any) => any, cell?: (j: any) => any, num?: boolean}} Col
 */

/**
 * Compare two cell values: numbers as numbers, text as text; a missing value sorts last in either direction.
 * @param {any} a
 * @param {any} b
 * @param {number} dir 1 ascending, -1 descending
 */
function compare(a, b, dir) {
  const missing = (/** @type {any} */ v) => v === null || v === undefined || (typeof v === "number" && !Number.isFinite(v));
  if (missing(a) || missing(b)) return missing(a) === missing(b) ? 0 : missing(a) ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return (a - b) * dir;
  return String(a).localeCompare(String(b), undefined, { numeric: true }) * dir;
}

const ENDED = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

/**
 * Which of the sweep's jobs each whole-sweep action would change.
 * @type {Record<"hold" | "release" | "cancel", (j: any) => boolean>}
 */
const APPLIES = {
  hold: (j) => j.state === "QUEUED" && !j.held,
  release: (j) => j.held && !ENDED.has(j.state),
  cancel: (j) => !ENDED.has(j.state),
};

/**
 * Over: every job has ended and no search will propose another (a TPE sweep between proposals is not over: its
 * cancel closes the search). Nothing is left to hold, release or cancel.
 * @param {any} sweep
 */
function sweepOver(sweep) {
  return sweep.jobs.every((/** @type {any} */ j) => ENDED.has(j.state)) && (!sweep.search || Boolean(sweep.search_closed));
}

/**
 * @param {HTMLElement} root
 * @param {string} id
 */
async function sweepPage(root, id) {
  const status = h("p", { id: "sweep-objective", class: "muted" });
  const body = h("div", { id: "sweep-summary", "aria-busy": "true" });
  const holdBtn = h("button", { type: "button", id: "hold-sweep", title: "Keep the sweep's queued jobs from starting until released" }, "Hold queued");
  const releaseBtn = h("button", { type: "button", id: "release-sweep", title: "Let the sweep's held jobs start again" }, "Release held");
  const chartBox = h("div", { class: "card", id: "sweep-curves" });
  const cancelBtn = h("button", { type: "button", class: "danger", id: "cancel-sweep", title: "Cancel every job of the sweep not yet ended" }, "Cancel sweep");
  root.append(pageHeader(`Sweep ${id}`, holdBtn, releaseBtn, cancelBtn), status, chartBox, body);
  /** @type {LineChart | null} */
  let chart = null; // made once the objective's name is known
  let sort = { key: "rank", dir: 1 }; // best first: the sweep's own ranking

  /** @param {any} sweep */
  const render = (sweep) => {
    const metricNames = [...new Set(sweep.jobs.flatMap((/** @type {any} */ j) => Object.keys(j.metrics ?? {})))].sort();
    /** @type {Col[]} */
    const cols = [
      { key: "rank", title: "Rank", value: (j) => j.rank, num: true },
      { key: "job", title: "Job", value: (j) => j.id, cell: (j) => h("a", { href: `#/jobs/${j.id}` }, `${j.id} ${j.name}`) },
      { key: "state", title: "State", value: (j) => j.state,
        cell: (j) => h("span", { title: j.exit_reason ?? "" }, stateBadge(j.state), j.held ? " held" : "",
          j.exit_reason?.startsWith("stopped early") ? " stopped early" : "") },
      ...sweep.keys.map((/** @type {string} */ k) => ({ key: `setting:${k}`, title: k, value: (/** @type {any} */ j) => j.settings[k], num: true })),
      { key: "step", title: "Step", value: (j) => j.last_step, cell: (j) => `${j.last_step} / ${j.steps}`, num: true },
      { key: "loss", title: "Final loss", value: (j) => j.last_loss, cell: (j) => fmtNumber(j.last_loss, 4), num: true },
      ...metricNames.map((m) => ({ key: `metric:${m}`, title: m, value: (/** @type {any} */ j) => j.metrics?.[m], cell: (/** @type {any} */ j) => fmtNumber(j.metrics?.[m], 4), num: true })),
    ];
    const col = cols.find((c) => c.key === sort.key) ?? cols[0];
    const rows = sweep.jobs.map((/** @type {any} */ j, /** @type {number} */ i) => ({ ...j, rank: i + 1 }));
    rows.sort((/** @type {any} */ a, /** @type {any} */ b) => compare(col.value(a), col.value(b), sort.dir) || a.rank - b.rank);
    const wrap = table(`Jobs of sweep ${sweep.id}`, cols.map((c) => ({
      title: c.title, class: c.num ? "num" : undefined,
      cell: (/** @type {any} */ j) => (c.cell ? c.cell(j) : (c.value(j) ?? "—")),
    })), rows, "No job.");
    // Each heading is a button that sorts by its column; aria-sort tells which and in which direction.
    wrap.querySelectorAll("thead th").forEach((th, i) => {
      const c = cols[i];
      const active = c.key === sort.key;
      th.setAttribute("aria-sort", active ? (sort.dir === 1 ? "ascending" : "descending") : "none");
      th.dataset.key = c.key;
      const arrow = active ? (sort.dir === 1 ? " ▲" : " ▼") : "";
      th.replaceChildren(h("button", {
        type: "button", class: "sort",
        onclick: () => { sort = { key: c.key, dir: active ? -sort.dir : 1 }; render(sweep); },
      }, c.title, h("span", { "aria-hidden": "true" }, arrow)));
    });
    replace(body, wrap);
    const over = sweepOver(sweep);
    for (const btn of [holdBtn, releaseBtn, cancelBtn]) btn.hidden = over;
    replace(status,
      `${sweep.name} · team ${sweep.team} · varies ${sweep.keys.join(", ")}`
      + (sweep.max_concurrent ? ` · at most ${sweep.max_concurrent} at once` : "")
      + `. Best first by ${sweep.objective.metric} (${sweep.objective.goal}): ${sweep.objective.rule}.`
      + (sweep.early_stopping ? ` Stops early by ${sweep.early_stopping}.` : "")
      + (sweep.search
        ? ` Searches by ${sweep.search}${sweep.search_closed ? ` (proposes no more: ${sweep.search_closed})` : ""}.`
        : "")
      + (over ? " Over: every job has ended." : ""));
  };

  /** Each job's objective over its steps, best job first (GET /v1/sweeps/{id}/curves). @param {any} curves */
  const plot = (curves) => {
    if (!chart) {
      chart = new LineChart({ id: "sweep-curves", title: `${curves.metric} over steps, each job (best first)`,
        xLabel: "step", yLabel: curves.metric, empty: "No job has reported it yet." });
      replace(chartBox, chart.el);
    }
    chart.setSeries(curves.curves.map((/** @type {any} */ c) => ({ name: `${c.job_id} ${c.name}`, points: c.points })));
  };

  const load = async () => {
    try {
      const path = `/v1/sweeps/${encodeURIComponent(id)}`;
      const [sweep, curves] = await Promise.all([api(path), api(`${path}/curves`)]);
      render(sweep);
      plot(curves);
    } catch (err) {
      showError(body, err);
    } finally {
      body.setAttribute("aria-busy", "false");
    }
  };
  /**
   * Hold the sweep's queued jobs that are not held, release its held ones, or cancel every job not yet ended: one
   * request (POST /v1/sweeps/{id}/hold|release|cancel), all or none, as `kiln hold|release|cancel --sweep`.
   * @param {"hold" | "release" | "cancel"} action
   */
  const actOnSweep = async (action) => {
    const path = `/v1/sweeps/${encodeURIComponent(id)}`;
    const count = (await api(path)).jobs.filter(APPLIES[action]).length;
    if (!count) {
      toast({ hold: "No queued job of this sweep to hold.", release: "No held job in this sweep.",
        cancel: "Every job of this sweep has ended." }[action]);
      return;
    }
    if (action === "cancel" && !window.confirm(`Cancel the ${count} job${count === 1 ? "" : "s"} of sweep ${id} not yet ended? Running ones stop, checkpoint first.`)) return;
    await api(`${path}/${action}`, { method: "POST" }); // its answer is the sweep; load() below redraws it and its curves
    const verb = { hold: "Held", release: "Released", cancel: "Cancelled" }[action];
    toast(`${verb} ${count} job${count === 1 ? "" : "s"} of sweep ${id}.`);
    await load();
  };
  for (const [btn, action] of /** @type {Array<[HTMLElement, "hold" | "release" | "cancel"]>} */ ([[holdBtn, "hold"], [releaseBtn, "release"], [cancelBtn, "cancel"]])) {
    btn.addEventListener("click", async () => {
      btn.setAttribute("disabled", "");
      try {
        await actOnSweep(action);
      } catch (err) {
        toast(`Could not ${action}: ${err instanceof Error ? err.message : err}`);
      } finally {
        btn.removeAttribute("disabled");
      }
    });
  }

  await load();
  const timer = window.setInterval(() => !document.hidden && load(), REFRESH_MS);
  return () => window.clearInterval(timer);
}
