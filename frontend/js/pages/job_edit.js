// Changing a job from its page: the dashboard's `kiln update` (PATCH /v1/jobs/{id}, Slurm's scontrol update).
// A queued job: its QoS class, time limit, GPUs and dependencies; a running one: its time limit only. The API is
// the one judge of what may change (a member may lower a running job's limit, only a team admin raise it; the GPU
// count only until the first checkpoint): its problem+json errors are shown beside the field they name.

import { ApiError, api } from "../api.js";
import { getContext } from "../context.js";
import { fmtDuration, h, replace, toast } from "../dom.js";

const EDITABLE = new Set(["QUEUED", "ADMITTED", "RUNNING"]);
const UNIT_S = { s: 1, m: 60, h: 3600, d: 86400, w: 7 * 86400 };

/**
 * A time limit as the CLI takes it: seconds (`7200`), a duration (`90m`, `2h`, `1d`, `1w`), or empty / `none`
 * for no limit. Throws on anything else.
 * @param {string} text
 * @returns {number | null}
 */
export function parseTimeLimit(text) {
  const t = text.trim().toLowerCase();
  if (t === "" || t === "none") return null;
  const m = /^(\d+)\s*([smhdw])$/.exec(t);
  if (m) return Number(m[1]) * UNIT_S[/** @type {keyof typeof UNIT_S} */ (m[2])];
  if (/^\d+(\.\d+)?$/.test(t)) return Number(t);
  throw new Error(`"${text.trim()}" is not a duration: seconds (7200), 90m, 2h, 1d, or empty for none`);
}

/**
 * A limit in the form's words: whole days, hours or minutes when it is one, else seconds.
 * @param {number | null | undefined} s
 */
export function formatTimeLimit(s) {
  if (s === null || s === undefined) return "";
  for (const [unit, n] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= Number(n) && s % Number(n) === 0) return `${s / Number(n)}${unit}`;
  }
  return String(s);
}

/** @param {string} text */
const parseDeps = (text) => text.split(/[\s,]+/).filter(Boolean);

/**
 * The "Edit" button of a job page and its dialog (for the page to place). `current()` gives the job as last
 * rendered; `saved(job)` is called with the API's answer.
 * @param {() => any} current
 * @param {(job: any) => void} saved
 * @returns {{button: HTMLElement, dialog: HTMLDialogElement, update: (job: any) => void}}
 */
export function jobEditor(current, saved) {
  const button = h("button", { type: "button", id: "edit-job", title: "Change its class, time limit, GPUs or dependencies" }, "Edit");
  const summary = h("div", { id: "edit-errors", class: "error-summary", tabindex: "-1", hidden: true });
  const note = h("p", { class: "help", id: "edit-note" });
  /** @type {Map<string, {wrap: HTMLElement, input: HTMLInputElement | HTMLSelectElement, error: HTMLElement}>} */
  const fields = new Map();
  /**
   * @param {string} key the API's field (and its errors' loc)
   * @param {string} label
   * @param {HTMLInputElement | HTMLSelectElement} input
   * @param {string} help
   */
  const field = (key, label, input, help) => {
    const id = `edit-${key.replace(/_/g, "-")}`;
    input.id = id;
    input.setAttribute("aria-describedby", `${id}-help ${id}-error`);
    const error = h("p", { id: `${id}-error`, class: "field-error" });
    const wrap = h("div", { class: "field" }, h("label", { for: id }, label), input, h("p", { id: `${id}-help`, class: "help" }, help), error);
    fields.set(key, { wrap, input, error });
    return wrap;
  };
  const qos = /** @type {HTMLSelectElement} */ (h("select", { name: "qos" }));
  const limit = /** @type {HTMLInputElement} */ (h("input", { name: "time_limit_s", type: "text", autocomplete: "off" }));
  const gpus = /** @type {HTMLInputElement} */ (h("input", { name: "gpus", type: "number", min: "0", inputmode: "numeric" }));
  const deps = /** @type {HTMLInputElement} */ (h("input", { name: "depends_on", type: "text", autocomplete: "off" }));
  const saveBtn = h("button", { type: "submit", class: "primary", id: "edit-save" }, "Save");
  const closeBtn = h("button", { type: "button", id: "edit-close" }, "Close");
  const form = h("form", { method: "dialog", novalidate: true },
    h("h2", { id: "edit-title" }, "Change the job"), note, summary,
    h("div", { class: "form-grid" },
      field("qos", "QoS class", qos, "The team's classes: the priority and the contract follow it"),
      field("time_limit_s", "Time limit", limit, "Seconds, 90m, 2h, 1d; empty for none. Counts every attempt's run"),
      field("gpus", "GPUs", gpus, "Until its first checkpoint; 0 runs on CPU slots"),
      field("depends_on", "Depends on", deps, "Jobs it waits for: 12, afterok:12, afterany:12; empty for none")),
    h("div", { class: "actions" }, saveBtn, closeBtn));
  const dialog = /** @type {HTMLDialogElement} */ (h("dialog", { id: "edit-dialog", "aria-labelledby": "edit-title" }, form));

  const clearErrors = () => {
    for (const f of fields.values()) {
      f.error.textContent = "";
      f.input.removeAttribute("aria-invalid");
    }
    summary.hidden = true;
    replace(summary);
  };
  /** @param {Array<{loc: string, msg: string}>} errors */
  const showErrors = (errors) => {
    /** @type {HTMLElement | null} */
    let first = null;
    const unplaced = [];
    for (const e of errors) {
      const f = fields.get(e.loc.split(".")[0]);
      if (f && !f.wrap.hidden) {
        f.error.textContent = [f.error.textContent, e.msg].filter(Boolean).join("; ");
        f.input.setAttribute("aria-invalid", "true");
        first ??= f.input;
      } else {
        unplaced.push(e.msg);
      }
    }
    if (unplaced.length) {
      summary.hidden = false;
      replace(summary, ...unplaced.map((m) => h("p", {}, m)));
      first = summary;
    }
    first?.focus();
  };

  /** The fields as the job has them now; a running job shows its time limit only. */
  const fill = async () => {
    const j = current();
    const ctx = await getContext();
    const granted = ctx.teams.find((t) => t.name === j.team)?.qos_classes ?? ctx.qos_classes.map((q) => q.name);
    const names = ctx.qos_classes.map((q) => q.name).filter((n) => granted.includes(n) || n === j.qos);
    replace(qos, ...names.map((n) => h("option", { value: n, selected: n === j.qos }, n)));
    limit.value = formatTimeLimit(j.spec?.time_limit_s);
    gpus.value = String(j.gpus);
    deps.value = (j.spec?.depends_on ?? []).join(" ");
    const queued = j.state === "QUEUED";
    for (const key of ["qos", "gpus", "depends_on"]) {
      const f = fields.get(key);
      if (f) f.wrap.hidden = !queued;
    }
    note.textContent = queued
      ? `Job #${j.id} is queued: checked as a submission is.`
      : `Job #${j.id} is ${j.state.toLowerCase()}: its time limit only (hold it to change the rest). A member may lower it; a team admin may raise or remove it.`;
  };

  /** What differs from the job as it is: the PATCH body. Throws with a field's error for what cannot be read. */
  const changes = () => {
    const j = current();
    /** @type {Record<string, unknown>} */
    const body = {};
    let seconds;
    try {
      seconds = parseTimeLimit(limit.value);
    } catch (err) {
      throw new ApiError(422, "invalid time limit", [{ loc: "time_limit_s", msg: err instanceof Error ? err.message : String(err) }]);
    }
    if (seconds !== (j.spec?.time_limit_s ?? null)) body.time_limit_s = seconds;
    if (j.state === "QUEUED") {
      if (qos.value !== j.qos) body.qos = qos.value;
      if (gpus.value.trim() !== "" && Number(gpus.value) !== j.gpus) body.gpus = Number(gpus.value);
      const wanted = parseDeps(deps.value);
      if (wanted.join(" ") !== (j.spec?.depends_on ?? []).join(" ")) body.depends_on = wanted;
    }
    return body;
  };

  button.addEventListener("click", async () => {
    clearErrors();
    try {
      await fill();
    } catch (err) {
      toast(`Could not load the team's classes: ${err instanceof Error ? err.message : err}`);
      return;
    }
    dialog.showModal();
    (fields.get(current().state === "QUEUED" ? "qos" : "time_limit_s")?.input)?.focus();
  });
  closeBtn.addEventListener("click", () => dialog.close());
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const j = current();
    try {
      const body = changes();
      if (!Object.keys(body).length) {
        dialog.close();
        toast(`Job #${j.id}: nothing changed.`);
        return;
      }
      saveBtn.setAttribute("disabled", "");
      const job = await api(`/v1/jobs/${j.id}`, { method: "PATCH", json: body });
      dialog.close();
      const lim = job.spec?.time_limit_s;
      toast(`Job #${job.id}: qos ${job.qos}, gpus ${job.gpus}, time limit ${lim ? fmtDuration(lim) : "none"}.`);
      saved(job);
    } catch (err) {
      showErrors(err instanceof ApiError && err.errors.length ? err.errors : [{ loc: "", msg: err instanceof Error ? err.message : String(err) }]);
    } finally {
      saveBtn.removeAttribute("disabled");
    }
  });

  return {
    button,
    dialog,
    update: (j) => {
      button.hidden = !EDITABLE.has(j.state) || j.cancel_requested;
    },
  };
}
