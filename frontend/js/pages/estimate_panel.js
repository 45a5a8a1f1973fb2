// The estimate beside the submit page's form and editor: `POST /v1/estimates` with the spec as it stands, once the
// user pauses typing (an older request still on its way is aborted). What the job would need, take and cost as
// written, the option kiln recommends, and the cheapest others: the same answer as `kiln estimate FILE`.

import { ApiError, api } from "../api.js";
import { fmtBytes, fmtDuration, h, replace, table } from "../dom.js";

const PAUSE_MS = 400;
const CHEAPEST = 5; // others shown besides the job as written and the recommended option

/** @typedef {{json: unknown} | {text: string, contentType: string}} SpecBody */

/** @param {number | null | undefined} s */
const seconds = (s) => (s === null || s === undefined ? "—" : s < 1 ? `${(s * 1000).toPrecision(3)} ms` : `${s.toPrecision(3)} s`);

/** @param {number | null | undefined} n */
const sig = (n) => (n === null || n === undefined ? "—" : n.toPrecision(3));

/** @param {any} o an option of the answer */
function memory(o) {
  if (o.peak_memory_bytes === null) return "—";
  const of = o.gpu_memory_bytes ? ` of ${fmtBytes(o.gpu_memory_bytes)}` : "";
  const fits = o.fits === true ? "fits" : o.fits === false ? "does not fit" : "";
  return `${fmtBytes(o.peak_memory_bytes)}${of} ${fits}`.trim();
}

/** @param {any} o */
function step(o) {
  const s = o.step_time;
  if (!s) return "no history";
  return `${seconds(s.median_s)} (${seconds(s.low_s)}–${seconds(s.high_s)}), ${s.label}`;
}

/** @param {Record<string, unknown>} changes */
function changes(changes) {
  const pairs = Object.entries(changes).map(([k, v]) => `${k.replace("recipe.hyperparameters.", "")}=${v ?? "(none)"}`);
  return pairs.length ? pairs.join(", ") : "as written";
}

/**
 * The rows shown: the job as written, the recommended option, then the cheapest others (the answer's order).
 * @param {any} answer
 */
function shown(answer) {
  const best = answer.recommended;
  const picked = [0, ...(best ? [best] : [])];
  for (let i = 1; i < answer.options.length && picked.length < CHEAPEST + 2; i++) if (i !== best) picked.push(i);
  return picked.map((i) => ({ ...answer.options[i], mark: i === 0 ? "as written" : "", best: i === best }));
}

/** @param {any} answer */
function render(answer) {
  const unit = answer.options[0]?.gpu_type === "cpu" ? "Slot-hours" : "GPU-hours";
  return table("Estimated options", [
    { title: "", cell: (/** @type {any} */ r) => [r.mark, r.best ? h("strong", {}, r.mark ? " · recommended" : "recommended") : null] },
    { title: "Option", cell: (/** @type {any} */ r) => r.description },
    { title: "Changes", cell: (/** @type {any} */ r) => changes(r.changes) },
    { title: "Memory/GPU", cell: memory },
    { title: "Step (p10–p90)", cell: step },
    { title: "Run", cell: (/** @type {any} */ r) => (r.hours === null ? "—" : fmtDuration(r.hours * 3600)) },
    { title: unit, cell: (/** @type {any} */ r) => sig(r.gpu_hours) },
    { title: `Cost (${answer.currency})`, cell: (/** @type {any} */ r) => sig(r.cost) },
    { title: "Deadline", cell: (/** @type {any} */ r) => (r.meets_deadline === null ? "—" : r.meets_deadline ? "meets" : "misses") },
  ], shown(answer));
}

/**
 * @param {() => SpecBody} body the spec as it stands now
 * @returns {{el: HTMLElement, refresh: () => void}}
 */
export function estimatePanel(body) {
  const summary = h("p", { id: "estimate-summary", "aria-live": "polite" }, "Estimating…");
  const options = h("div", { id: "estimate-options" });
  const notes = h("ul", { id: "estimate-notes", class: "help" });
  const el = h("section", { class: "card", id: "estimate", "aria-labelledby": "estimate-title" },
    h("h2", { id: "estimate-title" }, "Estimate"),
    h("p", { class: "help" }, "What the job as it stands would need, take and cost, from kiln's measured runs (kiln estimate FILE)."),
    summary, options, notes);
  /** @type {AbortController | null} */
  let inFlight = null;
  let timer = 0;
  const run = async () => {
    inFlight?.abort();
    const mine = new AbortController();
    inFlight = mine;
    try {
      const answer = await api("/v1/estimates", { ...body(), signal: mine.signal });
      replace(summary, answer.queue ? `${answer.summary}. ${answer.queue.sentence}` : answer.summary);
      replace(options, render(answer));
      replace(notes, answer.notes.map((/** @type {string} */ n) => h("li", {}, n)));
    } catch (err) {
      if (mine.signal.aborted) return; // a newer spec's estimate is on its way
      const first = err instanceof ApiError && err.errors.length ? err.errors[0] : null;
      replace(summary, first ? `No estimate until the spec is valid: ${first.loc}: ${first.msg}`
        : `No estimate: ${err instanceof Error ? err.message : String(err)}`);
      replace(options);
      replace(notes);
    }
  };
  const refresh = () => {
    window.clearTimeout(timer);
    timer = window.setTimeout(run, PAUSE_MS);
  };
  return { el, refresh };
}
