// Queue: what is waiting and running, by team and QoS class; position, pending reason, wait against the contract.

import { api, qs } from "../api.js";
import { getContext } from "../context.js";
import { bar, fmtDuration, h, pageHeader, replace, showError, stateBadge, table, timeEl } from "../dom.js";

const PAGE_SIZE = 50;
const REFRESH_MS = 5000;

/**
 * @typedef {{
 *   id: number, name: string, team: string, qos: string, state: string, position: number | null,
 *   gpus: number, gpu_type: string | null, pending_reason: string | null, pending_message: string | null,
 *   submitted_at: string, started_at: string | null, finished_at: string | null, wait_s: number,
 *   max_wait_s: number | null, last_step: number, steps: number | null, last_loss: number | null,
 *   restart_count: number, exit_reason: string | null,
 * }} QueueRow
 */

const VIEWS = /** @type {const} */ ({ waiting: "Waiting", active: "Running", finished: "Finished" });
// "Submitted": a window that rolls with each refresh (milliseconds back from now).
const SINCE = /** @type {const} */ ({ "1h": ["Last hour", 3600e3], "24h": ["Last 24 hours", 86400e3],
  "7d": ["Last 7 days", 7 * 86400e3] });

/** @type {import("../router.js").Page} */
export async function queuePage(root, _params, query) {
  const ctx = await getContext();
  /** @type {{view: string, team: string, qos: string, since: string, cursors: string[]}} */
  const state = {
    view: query.get("view") && query.get("view") in VIEWS ? /** @type {string} */ (query.get("view")) : "waiting",
    team: query.get("team") ?? "",
    qos: query.get("qos") ?? "",
    since: query.get("since") && query.get("since") in SINCE ? /** @type {string} */ (query.get("since")) : "",
    cursors: [""], // cursor of each page visited: Previous pops, Next pushes
  };

  const summaryEl = h("section", { class: "card", "aria-labelledby": "summary-title" });
  const listEl = h("div", { id: "queue-list", "aria-live": "polite", "aria-busy": "true" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages" });
  const status = h("p", { class: "muted", id: "queue-status" });

  const teamSelect = h(
    "select",
    { id: "f-team", name: "team" },
    h("option", { value: "" }, "All my teams"),
    ctx.teams.map((t) => h("option", { value: t.name, selected: t.name === state.team }, t.name)),
  );
  const qosSelect = h(
    "select",
    { id: "f-qos", name: "qos" },
    h("option", { value: "" }, "All classes"),
    ctx.qos_classes.map((q) => h("option", { value: q.name, selected: q.name === state.qos }, q.name)),
  );
  const sinceSelect = h(
    "select",
    { id: "f-since", name: "since" },
    h("option", { value: "" }, "Any time"),
    Object.entries(SINCE).map(([key, [label]]) => h("option", { value: key, selected: key === state.since }, label)),
  );
  const tabs = h(
    "div",
    { class: "segmented", role: "group", "aria-label": "Jobs to show" },
    Object.entries(VIEWS).map(([key, label]) =>
      h("button", { type: "button", "data-view": key, "aria-pressed": String(key === state.view) }, label),
    ),
  );
  const filters = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter the queue" },
    h("div", { class: "field" }, h("label", { for: "f-team" }, "Team"), teamSelect),
    h("div", { class: "field" }, h("label", { for: "f-qos" }, "QoS class"), qosSelect),
    h("div", { class: "field" }, h("label", { for: "f-since" }, "Submitted"), sinceSelect),
    tabs,
  );

  root.append(
    pageHeader("Queue", h("a", { class: "button primary", href: "#/submit" }, "Submit a job")),
    summaryEl,
    h("section", { class: "card", "aria-labelledby": "jobs-title" }, h("h2", { id: "jobs-title" }, "Jobs"), filters,
      status, listEl, pager),
  );

  /** @type {AbortController | null} */
  let inflight = null;

  const loadSummary = async () => {
    const data = await api("/v1/dashboard/queue/summary");
    const reasons = Object.entries(data.pending_reasons ?? {});
    replace(
      summaryEl,
      h("h2", { id: "summary-title" }, "By team and QoS class"),
      table(
        "Jobs by team and QoS class",
        [
          { title: "Team", cell: (/** @type {any} */ g) => g.team },
          { title: "QoS", cell: (/** @type {any} */ g) => g.qos },
          { title: "Waiting", cell: (/** @type {any} */ g) => `${g.waiting} (${g.gpus_waiting} GPUs)`, class: "num" },
          { title: "Running", cell: (/** @type {any} */ g) => `${g.active} (${g.gpus_active} GPUs)`, class: "num" },
          { title: "Oldest wait", cell: (/** @type {any} */ g) => fmtDuration(g.oldest_wait_s), class: "num" },
        ],
        data.groups,
        "No job is waiting or running.",
      ),
      reasons.length
        ? h("p", { class: "reasons" }, "Pending reasons: ",
            reasons.map(([r, n]) => h("span", { class: "chip" }, `${r} ${n}`)))
        : null,
    );
  };

  const load = async () => {
    inflight?.abort();
    inflight = new AbortController();
    listEl.setAttribute("aria-busy", "true");
    const cursor = state.cursors[state.cursors.length - 1];
    const started = performance.now();
    try {
      const span = state.since ? SINCE[/** @type {keyof SINCE} */ (state.since)][1] : 0;
      const after = span ? new Date(Date.now() - span).toISOString() : "";
      const page = await api(
        `/v1/dashboard/queue${qs({ view: state.view, team: state.team, qos: state.qos, submitted_after: after,
          limit: PAGE_SIZE, cursor })}`,
        { signal: inflight.signal },
      );
      renderList(page.items, page.total);
      renderPager(page.next_cursor);
      const first = (state.cursors.length - 1) * PAGE_SIZE + 1;
      status.textContent = page.total
        ? `${first}–${first + page.items.length - 1} of ${page.total} (${Math.round(performance.now() - started)} ms)`
        : "";
      listEl.dataset.loaded = String(Date.now());
    } catch (err) {
      if (err instanceof DOMException && err.name === "AbortError") return;
      showError(listEl, err);
    } finally {
      listEl.setAttribute("aria-busy", "false");
    }
  };

  /**
   * @param {QueueRow[]} items
   * @param {number} total
   */
  const renderList = (items, total) => {
    /** @type {Array<{title: string, cell: (r: QueueRow) => any, class?: string}>} */
    const columns = [];
    if (state.view === "waiting") columns.push({ title: "#", cell: (r) => r.position ?? "—", class: "num" });
    columns.push(
      { title: "Job", cell: (r) => h("a", { href: `#/jobs/${r.id}` }, `${r.name} `, h("span", { class: "muted" }, `#${r.id}`)) },
      { title: "Team", cell: (r) => r.team },
      { title: "QoS", cell: (r) => r.qos },
      { title: "State", cell: (r) => stateBadge(r.state) },
      { title: "GPUs", cell: (r) => (r.gpus ? `${r.gpus}${r.gpu_type ? ` × ${r.gpu_type}` : ""}` : "CPU"), class: "num" },
    );
    if (state.view === "waiting") {
      columns.push(
        {
          title: "Pending reason",
          cell: (r) => (r.pending_reason ? h("span", { title: r.pending_message ?? "" }, r.pending_reason,
            r.pending_message ? h("span", { class: "reason-msg" }, r.pending_message) : null) : h("span", { class: "muted" }, "not yet planned")),
        },
        {
          title: "Wait / max",
          cell: (r) => bar(r.wait_s, r.max_wait_s,
            `${fmtDuration(r.wait_s)} / ${r.max_wait_s ? fmtDuration(r.max_wait_s) : "no limit"}`, "Wait against contract"),
        },
      );
    } else {
      columns.push(
        { title: "Progress", cell: (r) => (r.steps ? `${r.last_step} / ${r.steps}` : String(r.last_step)), class: "num" },
        { title: "Restarts", cell: (r) => r.restart_count, class: "num" },
        { title: "Queue wait", cell: (r) => bar(r.wait_s, r.max_wait_s, fmtDuration(r.wait_s), "Wait against contract") },
      );
      // Why it ended, as kiln ls says it: a failure's own line (the team's code's error, a time limit), a cancel's reason.
      if (state.view === "finished") columns.push({ title: "Reason", cell: (r) => r.exit_reason ?? "—" });
    }
    columns.push({ title: state.view === "finished" ? "Finished" : "Submitted",
      cell: (r) => timeEl(state.view === "finished" ? r.finished_at : r.submitted_at) });
    const empty = state.view === "waiting" ? "No job is waiting." : state.view === "active" ? "No job is running." : "No finished job.";
    replace(listEl, table(`${VIEWS[/** @type {keyof VIEWS} */ (state.view)]} jobs (${total})`, columns, items, empty));
  };

  /** @param {string | null} next */
  const renderPager = (next) => {
    const prev = h("button", { type: "button", disabled: state.cursors.length <= 1 }, "← Previous");
    const nextBtn = h("button", { type: "button", disabled: !next }, "Next →");
    prev.addEventListener("click", () => {
      state.cursors.pop();
      load();
    });
    nextBtn.addEventListener("click", () => {
      if (next) state.cursors.push(next);
      load();
    });
    replace(pager, prev, h("span", { class: "muted" }, `Page ${state.cursors.length}`), nextBtn);
  };

  const syncUrl = () => {
    const q = qs({ view: state.view === "waiting" ? "" : state.view, team: state.team, qos: state.qos,
      since: state.since });
    history.replaceState(null, "", `#/queue${q}`);
  };
  const restart = () => {
    state.cursors = [""];
    syncUrl();
    load();
  };
  teamSelect.addEventListener("change", () => {
    state.team = /** @type {HTMLSelectElement} */ (teamSelect).value;
    restart();
  });
  qosSelect.addEventListener("change", () => {
    state.qos = /** @type {HTMLSelectElement} */ (qosSelect).value;
    restart();
  });
  sinceSelect.addEventListener("change", () => {
    state.since = /** @type {HTMLSelectElement} */ (sinceSelect).value;
    restart();
  });
  filters.addEventListener("submit", (ev) => ev.preventDefault());
  for (const btn of tabs.querySelectorAll("button")) {
    btn.addEventListener("click", () => {
      state.view = /** @type {string} */ (btn.dataset.view);
      tabs.querySelectorAll("button").forEach((b) => b.setAttribute("aria-pressed", String(b === btn)));
      restart();
    });
  }

  await Promise.all([load(), loadSummary().catch((err) => showError(summaryEl, err))]);
  // Refresh the page being looked at (not the whole queue): cheap even with 10,000 jobs waiting.
  const timer = window.setInterval(() => {
    if (document.hidden) return;
    load();
    loadSummary().catch(() => {});
  }, REFRESH_MS);
  return () => {
    window.clearInterval(timer);
    inflight?.abort();
  };
}
