// One job: state, wait against the contract, curves (loss, throughput, GPU), timeline, live logs, checkpoints,
// restarts with their recovery times, each attempt's compile (the compile cache's reuse), compile fallbacks, loss
// spikes, and what kiln forecast for it against what happened.

import { ApiError, api, follow, getToken, parseEventStream, qs } from "../api.js";
import { LineChart } from "../chart.js";
import { jobEditor } from "./job_edit.js";
import {
  bar, fmtBytes, fmtDuration, fmtForecastAmount, fmtNumber, fmtTime, h, pageHeader, replace, showError, stateBadge, table,
  timeEl, toast,
} from "../dom.js";

const FINISHED = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const HOLDABLE = new Set(["QUEUED", "ADMITTED", "RUNNING", "PREEMPTING"]);
const MAX_LOG_LINES = 5000;

/**
 * @typedef {{id: number, step: number, ts: string, loss: number | null, grad_norm: number | null,
 *   tokens_per_s: number | null, step_time_s: number | null, mfu: number | null, mem_peak_bytes: number | null,
 *   extra: Record<string, any>}} MetricRow
 * @typedef {{job: any, contract: any, attempts: any[], restarts: any[], checkpoints: any[], events: any[],
 *   compile_fallbacks: any[], loss_spikes: any[], code: any, evaluations: any[],
 *   datasets?: Array<{name: string, path: string | null}>}} Overview
 */

/**
 * GPU samples relayed in `extra.gpu` (one record per GPU per sample: util_gpu, mem_used_bytes,
 * pcie/nvlink rx/tx bytes/s, ts in unix seconds), as chart series keyed by GPU.
 * @param {MetricRow[]} rows
 * @returns {{util: import("../chart.js").Series[], mem: import("../chart.js").Series[],
 *   bw: import("../chart.js").Series[]}}
 */
export function gpuSeries(rows) {
  /** @type {Map<string, [number, number][]>} */
  const util = new Map();
  /** @type {Map<string, [number, number][]>} */
  const mem = new Map();
  /** @type {Map<string, [number, number][]>} */
  const bw = new Map();
  const seen = new Set();
  const push = (/** @type {Map<string, [number, number][]>} */ m, /** @type {string} */ k, /** @type {number} */ x, /** @type {unknown} */ y) => {
    if (typeof y !== "number" || !Number.isFinite(y)) return;
    if (!m.has(k)) m.set(k, []);
    m.get(k)?.push([x, y]);
  };
  for (const row of rows) {
    const samples = Array.isArray(row.extra?.gpu) ? row.extra.gpu : [];
    for (const s of samples) {
      const gpu = String(s.gpu_uuid ?? `rank${s.rank ?? 0}`).slice(-8);
      const t = typeof s.ts === "number" ? s.ts * 1000 : Date.parse(row.ts);
      const key = `${gpu}@${t}`;
      if (seen.has(key)) continue; // the relay repeats the last samples on consecutive rows
      seen.add(key);
      push(util, `GPU ${gpu}`, t, s.util_gpu);
      push(mem, `GPU ${gpu} used`, t, s.mem_used_bytes);
      push(bw, `${gpu} PCIe tx`, t, s.pcie_tx_bytes_per_s);
      push(bw, `${gpu} PCIe rx`, t, s.pcie_rx_bytes_per_s);
      push(bw, `${gpu} NVLink tx`, t, s.nvlink_tx_bytes_per_s);
      push(bw, `${gpu} NVLink rx`, t, s.nvlink_rx_bytes_per_s);
    }
  }
  const toSeries = (/** @type {Map<string, [number, number][]>} */ m) =>
    [...m.entries()].map(([name, points]) => ({ name, points: points.sort((a, b) => a[0] - b[0]) }));
  return { util: toSeries(util), mem: toSeries(mem), bw: toSeries(bw) };
}

/**
 * What the job runs on: GPUs, a fractional job's share of one GPU (its class's caps where the spec leaves them
 * out), or CPU slots.
 * @param {any} j
 */
function resources(j) {
  const share = j.spec?.resources?.gpu_share;
  const type = j.gpu_type ? ` × ${j.gpu_type}` : "";
  if (share) {
    const memory = share.memory_gb ? `${share.memory_gb} GiB` : "the class's memory cap";
    const sm = share.sm_percent ? `${share.sm_percent}% of the SMs` : "the class's SM share";
    return `a share of one GPU${type}: ${memory}, ${sm} (MPS)`;
  }
  return j.gpus ? `${j.gpus} GPU${j.gpus > 1 ? "s" : ""}${type}` : "CPU";
}

const clock = (/** @type {number} */ ms) => new Date(ms).toLocaleTimeString(undefined, { hour12: false });

/**
 * A link that downloads an API path with the session's token (a plain href would carry no Authorization header).
 * @param {string} path
 * @param {string} filename
 */
function downloadLink(path, filename) {
  const link = h("a", { href: "#", id: "code-download" }, "download (.tar.gz)");
  link.addEventListener("click", async (event) => {
    event.preventDefault();
    const resp = await fetch(path, { headers: { Authorization: `Bearer ${getToken() || ""}` } });
    if (!resp.ok) return;
    const url = URL.createObjectURL(await resp.blob());
    const a = h("a", { href: url, download: filename });
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });
  return link;
}

/**
 * A queued job's expected start: the API's one answer (GET /v1/jobs/{id}/why, as kiln why and kiln describe say it),
 * a range of times and where, or why it cannot be known.
 * @param {{expected_start: string | null, expected_start_latest: string | null, expected_start_hosts: string[],
 *   expected_start_basis: string | null}} why
 */
export function expectedStartText(why) {
  if (!why.expected_start) return why.expected_start_basis ?? "—";
  const early = fmtTime(why.expected_start);
  const late = fmtTime(why.expected_start_latest);
  const when = !why.expected_start_latest || late === early ? early : `${early} to ${late}`;
  const where = why.expected_start_hosts?.length ? ` on ${why.expected_start_hosts.join(", ")}` : "";
  return `${when}${where}${why.expected_start_basis ? ` (${why.expected_start_basis})` : ""}`;
}

/** @param {number} id */
function expectedStartEl(id) {
  const el = h("span", { id: "expected-start" }, "…");
  api(`/v1/jobs/${id}/why`).then((why) => replace(el, expectedStartText(why)), () => replace(el, "—"));
  return el;
}

const FORECAST_KINDS = /** @type {Record<string, string>} */ ({
  start_time: "Start", peak_memory: "Peak memory per rank", step_time: "Step time", gpu_hours: "GPU-hours",
});

/**
 * A forecast's amount as the job would read it: a start as a time (its amounts are seconds after it was made), the
 * rest in their unit.
 * @param {any} f one of GET /v1/jobs/{id}'s `forecasts` @param {number | null} v
 */
function forecastValue(f, v) {
  if (v === null || v === undefined) return "—";
  if (f.kind !== "start_time") return fmtForecastAmount(v, f.unit);
  return fmtTime(new Date(Date.parse(f.made_at) + v * 1000).toISOString());
}

/** What kiln forecast for the job (GET /v1/jobs/{id}'s `forecasts`, as kiln describe shows them), and what happened.
 * @param {any[]} rows */
export function forecastsTable(rows) {
  return table("Forecasts", [
    { title: "Kind", cell: (/** @type {any} */ f) => FORECAST_KINDS[f.kind] ?? f.kind },
    { title: "By", cell: (/** @type {any} */ f) => f.source },
    { title: "Forecast", cell: (/** @type {any} */ f) => f.predicted === null ? (f.note ?? "cannot be known")
      : forecastValue(f, f.predicted) + (f.predicted_high !== null && f.predicted_high !== f.predicted
        ? ` to ${forecastValue(f, f.predicted_high)}` : "") },
    { title: "Happened", cell: (/** @type {any} */ f) => f.actual !== null ? forecastValue(f, f.actual)
      : f.settled_at ? "never" : "not yet" },
    { title: "Error", class: "num", cell: (/** @type {any} */ f) => f.actual === null || f.predicted === null ? "—"
      : fmtForecastAmount(f.actual - f.predicted, f.unit, true)
        + (f.kind === "start_time" || !f.actual ? "" : ` (${(100 * Math.abs(f.actual - f.predicted) / f.actual).toFixed(1)}%)`) },
  ], rows, "No forecast for this job.");
}

/** @type {import("../router.js").Page} */
export async function jobPage(root, params) {
  const id = Number(params.id);
  /** @type {Overview} */
  let overview;
  try {
    overview = await api(`/v1/dashboard/jobs/${id}`);
  } catch (err) {
    root.append(pageHeader(`Job ${id}`));
    const box = h("div", { class: "card" });
    root.append(box);
    showError(box, err instanceof ApiError && err.status === 404 ? new Error(`Job ${id} does not exist, or is not yours to see.`) : err);
    return;
  }

  /** @type {MetricRow[]} */
  const metrics = [];
  let lastMetricId = 0;

  const stateEl = h("span", { id: "job-state" });
  const holdBtn = h("button", { type: "button", id: "hold-job" }, "Hold");
  const cancelBtn = h("button", { type: "button", class: "danger", id: "cancel-job" }, "Cancel job");
  const editor = jobEditor(() => overview.job, async () => renderOverview(await api(`/v1/dashboard/jobs/${id}`)));
  const facts = h("dl", { class: "facts", id: "job-facts" });
  const liveEl = h("span", { class: "muted live", id: "live-mode" }, "");

  // tokens/s for a language model, samples/s for an image model: what its recipe counts (the API says which)
  const unit = overview.job.throughput_unit ?? "items/s";
  const charts = {
    loss: new LineChart({ id: "loss", title: "Loss over steps", xLabel: "step" }),
    throughput: new LineChart({ id: "throughput", title: `Throughput (${unit}) over steps`, xLabel: "step", yLabel: unit }),
    util: new LineChart({ id: "gpu-util", title: "GPU utilisation (%)", time: true, xFormat: clock, yMin: 0, yMax: 100,
      empty: "No GPU samples (a CPU job, or none yet)" }),
    mem: new LineChart({ id: "gpu-mem", title: "GPU memory used (bytes)", time: true, xFormat: clock, yMin: 0,
      empty: "No GPU samples (a CPU job, or none yet)" }),
    bw: new LineChart({ id: "gpu-bw", title: "Interconnect bandwidth (bytes/s)", time: true, xFormat: clock, yMin: 0,
      empty: "No PCIe/NVLink samples yet" }),
    evaluation: new LineChart({ id: "evaluation", title: "Evaluation metrics over steps", xLabel: "step",
      empty: "No evaluation (a built-in recipe, or a team's code without evaluate())" }),
  };

  const timeline = h("ol", { class: "timeline", id: "timeline", "aria-label": "Events, newest first" });
  const restartsEl = h("div", { id: "restarts" });
  const checkpointsEl = h("div", { id: "checkpoints" });
  const compileEl = h("ul", { id: "compile-cache" });
  const healthEl = h("div", { id: "health" });
  const forecastsEl = h("div", { id: "job-forecasts" });

  const logBox = h("pre", { class: "logs", id: "logs", role: "log", tabindex: "0", "aria-label": "Job logs", "aria-live": "off" });
  const followBox = /** @type {HTMLInputElement} */ (h("input", { type: "checkbox", id: "follow-logs", checked: true }));
  const logStatus = h("span", { class: "muted", id: "log-status" }, "connecting…");

  root.append(
    pageHeader(overview.job.name, stateEl, liveEl, editor.button, holdBtn, cancelBtn),
    editor.dialog,
    h("section", { class: "card", "aria-label": "Summary" }, facts),
    h("section", { class: "grid charts", "aria-label": "Training curves" },
      Object.values(charts).map((c) => h("div", { class: "card" }, c.el))),
    h("div", { class: "grid two" },
      h("section", { class: "card", "aria-labelledby": "tl-title" }, h("h2", { id: "tl-title" }, "Timeline"), timeline),
      h("section", { class: "card", "aria-labelledby": "health-title" }, h("h2", { id: "health-title" }, "Health"),
        healthEl, h("h3", {}, "Compile cache"), compileEl, h("h3", {}, "Restarts"), restartsEl,
        h("h3", {}, "Checkpoints"), checkpointsEl, h("h3", {}, "Forecasts"), forecastsEl)),
    h("section", { class: "card", "aria-labelledby": "logs-title" },
      h("div", { class: "row" }, h("h2", { id: "logs-title" }, "Logs"), logStatus,
        h("label", { class: "inline", for: "follow-logs" }, followBox, " Follow")),
      logBox),
  );

  // ---- rendering -------------------------------------------------------------------------------------------

  // A job's forecasts settle as it starts, measures and ends: read again when its state changes.
  let forecastsFor = "";
  const loadForecasts = (/** @type {string} */ state) => {
    if (state === forecastsFor) return;
    forecastsFor = state;
    api(`/v1/jobs/${id}`).then((d) => replace(forecastsEl, forecastsTable(d.forecasts ?? [])), (err) => showError(forecastsEl, err));
  };

  /** @param {Overview} ov */
  const renderOverview = (ov) => {
    overview = ov;
    const j = ov.job;
    loadForecasts(j.state);
    replace(stateEl, stateBadge(j.state));
    stateEl.dataset.state = j.state;
    cancelBtn.hidden = FINISHED.has(j.state) || j.cancel_requested;
    // A queued job can be held (it does not start until released), a running one too (it stops, checkpoint
    // first, and waits in the queue held); a held one released.
    holdBtn.hidden = !HOLDABLE.has(j.state) || j.cancel_requested;
    editor.update(j);
    holdBtn.textContent = j.held_at ? "Release" : "Hold";
    holdBtn.title = j.held_at ? "Let the scheduler start it again" : "Keep it from starting until you release it";
    const waitText = `${fmtDuration(j.wait_s)} / ${j.max_wait_s ? fmtDuration(j.max_wait_s) : "no limit"}`;
    /** @type {Array<[string, any]>} */
    const rows = [
      ["Job", `#${j.id}`],
      ["Team", j.team],
      ["QoS class", j.qos],
      ["Resources", resources(j)],
      ["Time limit", j.spec?.time_limit_s ? fmtDuration(j.spec.time_limit_s) : "none"],
      ["Progress", j.steps ? `step ${j.last_step} of ${j.steps}` : `step ${j.last_step}`],
      ["Last loss", fmtNumber(j.last_loss, 4)],
      ["Queue wait", bar(j.wait_s, j.max_wait_s, waitText, "Queue wait against the contract")],
      ["Restarts", `${j.restart_count}${ov.contract ? ` of at most ${ov.contract.max_restarts}` : ""}`],
      ["Submitted", timeEl(j.submitted_at)],
      ["Started", timeEl(j.started_at)],
      ["Finished", timeEl(j.finished_at)],
    ];
    if (j.state === "QUEUED") rows.splice(4, 0, ["Pending reason", j.pending_reason ? `${j.pending_reason}${j.pending_message ? `: ${j.pending_message}` : ""}` : "not yet planned"]);
    if (j.state === "QUEUED") rows.splice(5, 0, ["Expected start", expectedStartEl(j.id)]);
    if (j.spec?.depends_on?.length) rows.push(["Depends on", j.spec.depends_on.join(", ")]);
    if (j.exit_reason) rows.push(["Exit reason", j.exit_reason]);
    if (ov.contract?.standing) {
      const terms = Object.entries(ov.contract.standing).map(([k, v]) => `${k === "step_time_tolerance" ? "step time" : k} ${v}`);
      if (terms.length) rows.push(["SLA (steps)", h("span", { id: "sla-standing" }, terms.join(", "))]);
    }
    if (j.spec?.command) rows.push(["Command", h("code", { id: "job-command" }, j.spec.command.join(" "))]);
    if (ov.code) {
      rows.push(["Code", h("code", { id: "code-digest", title: ov.code.digest }, `sha256:${ov.code.digest}`)]);
      if (ov.code.entry_point) rows.push(["Entry point", h("code", {}, ov.code.entry_point)]);
      rows.push(["Archive", downloadLink(ov.code.download, `${j.team}-${ov.code.digest.slice(0, 12)}.tar.gz`)]);
    }
    if (ov.datasets && ov.datasets.length) {
      rows.push(["Datasets", h("span", { id: "job-datasets" }, ov.datasets.flatMap((d, i) => [
        i ? ", " : "",
        h("code", { title: d.path ? `storage: ${d.path}` : "no longer registered" }, d.name),
        d.path ? " (read-only)" : " (removed)",
      ]))]);
    }
    if (j.evaluation) {
      const shown = Object.entries(j.evaluation.metrics || {}).map(([k, v]) => `${k} ${fmtNumber(v, 4)}`).join(", ");
      rows.push(["Evaluation", `step ${j.evaluation.step}: ${shown}`]);
    }
    if (j.cancel_requested && !FINISHED.has(j.state)) rows.push(["Cancel", "requested"]);
    if (j.held_at && j.state !== "QUEUED") rows.push(["Hold", `${j.pending_message ?? "held"}: stopping, checkpoint first, then back in the queue held`]);
    replace(facts, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));

    // Newest first: how the job ended (SUCCEEDED, CANCELLED) is the first line, never below the box's fold.
    replace(timeline, [...ov.events].reverse().map((e) =>
      h("li", { "data-type": e.type }, timeEl(e.created_at), " ", h("strong", {}, e.type), " ", e.message)));

    // Each attempt's compile, in the API's words (the same as kiln describe): hit or miss, source, key, time saved.
    replace(compileEl, ov.attempts.length
      ? ov.attempts.map((a) => h("li", { "data-status": a.compile.status },
        h("strong", {}, `Attempt ${a.number}: `), a.compile.summary))
      : h("li", {}, "No attempt yet."));

    const rto = ov.contract?.recovery_time_objective_s;
    replace(restartsEl, table("Restarts", [
      { title: "Attempts", cell: (/** @type {any} */ r) => `${r.from_attempt} → ${r.to_attempt}` },
      { title: "Why", cell: (/** @type {any} */ r) => r.reason },
      { title: "Resumed from", cell: (/** @type {any} */ r) => (r.resumed_from_step ?? "start"), class: "num" },
      { title: "Recovery", cell: (/** @type {any} */ r) => r.recovery_s === null ? "recovering…"
        : bar(r.recovery_s, rto, `${fmtDuration(r.recovery_s)}${rto ? ` / ${fmtDuration(rto)}` : ""}`, "Recovery time against objective") },
    ], ov.restarts, "No restart."));

    replace(checkpointsEl, table("Checkpoints", [
      { title: "Step", cell: (/** @type {any} */ c) => c.step, class: "num" },
      { title: "Size", cell: (/** @type {any} */ c) => fmtBytes(c.bytes), class: "num" },
      { title: "Verified", cell: (/** @type {any} */ c) => (c.verified ? "yes" : "no") },
      { title: "When", cell: (/** @type {any} */ c) => timeEl(c.created_at) },
      { title: "SHA-256", cell: (/** @type {any} */ c) => h("code", { title: c.sha256 }, (c.sha256 || "").slice(0, 12)) },
    ], ov.checkpoints, "No checkpoint yet."));

    replace(healthEl,
      h("p", {}, h("strong", {}, "Compile fallbacks: "), ov.compile_fallbacks.length ? "" : "none"),
      ov.compile_fallbacks.length ? h("ul", {}, ov.compile_fallbacks.map((f) => h("li", {}, timeEl(f.created_at), ` ${f.type}: ${f.message}`))) : null,
      h("p", {}, h("strong", {}, "Loss spikes: "), ov.loss_spikes.length ? "" : "none"),
      ov.loss_spikes.length ? h("ul", {}, ov.loss_spikes.map((s) => h("li", {}, timeEl(s.created_at), ` ${s.message}`))) : null,
    );
    /** @type {Map<string, [number, number][]>} */
    const evalSeries = new Map();
    for (const ev of ov.evaluations || []) {
      for (const [name, value] of Object.entries(ev.metrics || {})) {
        if (typeof value !== "number" || typeof ev.step !== "number") continue;
        if (!evalSeries.has(name)) evalSeries.set(name, []);
        evalSeries.get(name)?.push([ev.step, value]);
      }
    }
    charts.evaluation.setSeries([...evalSeries.entries()].map(([name, points]) => ({ name, points })));
    charts.loss.setMarkers(ov.loss_spikes
      .filter((s) => typeof s.data?.step === "number")
      .map((s) => ({ x: s.data.step, label: `loss spike: ${s.message}` })));
  };

  /** @param {MetricRow[]} rows */
  const addMetrics = (rows) => {
    if (!rows.length) return;
    metrics.push(...rows);
    lastMetricId = Math.max(lastMetricId, rows[rows.length - 1].id);
    // One series per attempt, so a restart that replays steps shows as its own line.
    /** @type {Map<string, {loss: [number, number][], tput: [number, number][]}>} */
    const byAttempt = new Map();
    let attempt = 0;
    let prevStep = -1;
    for (const m of metrics) {
      if (m.step < prevStep) attempt++;
      prevStep = m.step;
      const key = attempt ? `attempt ${attempt + 1}` : "loss";
      if (!byAttempt.has(key)) byAttempt.set(key, { loss: [], tput: [] });
      const s = byAttempt.get(key);
      if (m.loss !== null && m.loss !== undefined) s?.loss.push([m.step, m.loss]);
      if (m.tokens_per_s !== null && m.tokens_per_s !== undefined) s?.tput.push([m.step, m.tokens_per_s]);
    }
    charts.loss.setSeries([...byAttempt.entries()].map(([name, s]) => ({ name, points: s.loss })));
    charts.throughput.setSeries([...byAttempt.entries()].map(([name, s]) => ({ name: name === "loss" ? unit : name, points: s.tput })));
    const gpu = gpuSeries(metrics);
    charts.util.setSeries(gpu.util);
    charts.mem.setSeries(gpu.mem);
    charts.bw.setSeries(gpu.bw.filter((s) => s.points.some((p) => p[1] > 0)));
  };

  // ---- live updates: SSE, polling when the stream cannot be held -------------------------------------------
  // The stream starts at metric id 0, so its first messages are the history; then it follows.

  renderOverview(overview);
  /** @type {() => void} */
  let stopLive = () => {};
  stopLive = follow(`/v1/dashboard/jobs/${id}/stream${qs({ after_id: 0 })}`, {
    events: ["overview", "metrics", "end"],
    onMessage: (type, data) => {
      if (type === "overview") renderOverview(JSON.parse(data));
      else if (type === "metrics") addMetrics(JSON.parse(data).items);
      else if (type === "end") {
        stopLive(); // the job is over: do not let the browser reconnect
        liveEl.textContent = "finished";
      }
    },
    poll: async () => {
      const [ov, m] = await Promise.all([
        api(`/v1/dashboard/jobs/${id}`),
        api(`/v1/dashboard/jobs/${id}/metrics${qs({ after_id: lastMetricId })}`),
      ]);
      renderOverview(ov);
      addMetrics(m.items);
    },
    onModeChange: (mode) => {
      if (mode !== "closed") liveEl.textContent = mode === "sse" ? "live" : "live (polling)";
    },
  });

  const logLines = /** @type {string[]} */ ([]);
  /** @param {string[]} lines */
  const appendLogs = (lines) => {
    logLines.push(...lines);
    if (logLines.length > MAX_LOG_LINES) logLines.splice(0, logLines.length - MAX_LOG_LINES);
    logBox.textContent = logLines.join("\n");
    if (followBox.checked) logBox.scrollTop = logBox.scrollHeight;
  };
  // The API streams the log file of the latest attempt, `event: log` per line, `event: end` when the job ends;
  // a dropped connection resumes after the last line shown (follow() in api.js).
  /** @type {() => void} */
  let stopLogs = () => {};
  stopLogs = follow(`/v1/jobs/${id}/logs${qs({ follow: "true" })}`, {
    events: ["log", "attempt", "end"],
    onMessage: (type, data) => {
      if (type === "attempt") return; // the next lines are a restart's: the stream switched by itself
      if (type === "end") {
        stopLogs();
        logStatus.textContent = "ended";
        return;
      }
      appendLogs([data]);
    },
    poll: async () => {
      // Fallback: the whole log so far (follow=false ends the stream at once), shown afresh each time.
      const body = await api(`/v1/jobs/${id}/logs${qs({ follow: "false" })}`);
      logLines.length = 0;
      appendLogs(parseEventStream(String(body ?? ""), "log"));
    },
    onModeChange: (mode) => {
      if (mode !== "closed") logStatus.textContent = mode === "sse" ? "streaming" : "polling";
    },
  });

  // ---- actions ----------------------------------------------------------------------------------------------
  cancelBtn.addEventListener("click", async () => {
    if (!window.confirm(`Cancel job ${overview.job.name} (#${id})?`)) return;
    cancelBtn.setAttribute("disabled", "");
    try {
      await api(`/v1/jobs/${id}/cancel`, { method: "POST" });
      toast(`Cancel requested for job #${id}.`);
      renderOverview(await api(`/v1/dashboard/jobs/${id}`));
    } catch (err) {
      toast(`Could not cancel: ${err instanceof Error ? err.message : err}`);
    } finally {
      cancelBtn.removeAttribute("disabled");
    }
  });

  holdBtn.addEventListener("click", async () => {
    const action = overview.job.held_at ? "release" : "hold";
    if (action === "hold" && overview.job.state !== "QUEUED"
      && !window.confirm(`Hold job ${overview.job.name} (#${id})? It stops (checkpoint first) and waits in the queue until released.`)) return;
    holdBtn.setAttribute("disabled", "");
    try {
      await api(`/v1/jobs/${id}/${action}`, { method: "POST" });
      toast(action === "hold" ? `Job #${id} is held: it does not start until released.` : `Job #${id} released.`);
      renderOverview(await api(`/v1/dashboard/jobs/${id}`));
    } catch (err) {
      toast(`Could not ${action}: ${err instanceof Error ? err.message : err}`);
    } finally {
      holdBtn.removeAttribute("disabled");
    }
  });

  return () => {
    stopLive();
    stopLogs();
  };
}
