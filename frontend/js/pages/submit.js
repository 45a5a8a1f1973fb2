// Submit: a form, or the job spec as YAML. The API is the one validator: its problem+json `errors[].loc`
// are shown beside the field they name (form) or at the line that holds it (YAML).

import { ApiError, api } from "../api.js";
import { getContext } from "../context.js";
import { h, pageHeader, replace } from "../dom.js";
import { navigate } from "../router.js";
import { estimatePanel } from "./estimate_panel.js";

/**
 * A form field: `loc` is its path in the job spec, which is also how API errors find it.
 * @typedef {{loc: string, label: string, type?: string, options?: string[], value?: string, help?: string,
 *   parse?: (v: string) => unknown, rows?: number}} FieldDef
 */

const num = (/** @type {string} */ v) => (v.trim() === "" ? undefined : Number(v));
const str = (/** @type {string} */ v) => (v.trim() === "" ? undefined : v.trim());

/** @param {string} loc */
const fieldId = (loc) => `f-${loc.replace(/[^a-z0-9]+/gi, "-")}`;

const EXAMPLE_YAML = `name: gpt-tiny
team: default
recipe:
  name: gpt
  hyperparameters:
    size: tiny
    corpus: stdlib
    batch_size: 8
    seq_len: 128
    lr: 0.003
steps: 60
resources:
  gpus: 0
  cpu_slots: 1
parallelism: ddp
compile:
  mode: "off"
precision: fp32
checkpointing:
  every_steps: 20
  keep_last: 2
sla:
  qos: silver
  max_queue_wait_s: 600
`;

/**
 * Set `value` at a dotted path, creating the objects on the way; `undefined` leaves the path out.
 * @param {Record<string, any>} obj
 * @param {string} path
 * @param {unknown} value
 */
function setPath(obj, path, value) {
  if (value === undefined) return;
  const parts = path.split(".");
  let cur = obj;
  for (const p of parts.slice(0, -1)) cur = cur[p] ??= {};
  cur[parts[parts.length - 1]] = value;
}

/**
 * Parse `key: value` lines (the hyperparameters box) into an object: numbers, booleans, strings.
 * @param {string} text
 * @returns {Record<string, unknown> | undefined}
 */
export function parseKeyValues(text) {
  /** @type {Record<string, unknown>} */
  const out = {};
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const i = line.indexOf(":") >= 0 ? line.indexOf(":") : line.indexOf("=");
    if (i < 0) {
      out[line] = null;
      continue;
    }
    const key = line.slice(0, i).trim();
    const v = line.slice(i + 1).trim().replace(/^["'](.*)["']$/, "$1");
    out[key] = v === "true" ? true : v === "false" ? false : v !== "" && !Number.isNaN(Number(v)) ? Number(v) : v;
  }
  return Object.keys(out).length ? out : undefined;
}

/**
 * The line (1-based) of the YAML text that holds a dotted path, by indentation; 0 when not found.
 * Good enough for block-style specs, which is what people write; flow-style maps point at their parent.
 * @param {string} text
 * @param {string} loc
 * @returns {number}
 */
export function yamlLine(text, loc) {
  const lines = text.split("\n");
  const parts = loc.split(".").filter(Boolean);
  let from = 0;
  let indent = -1;
  let found = 0;
  for (const part of parts) {
    let hit = -1;
    for (let i = from; i < lines.length; i++) {
      const m = /^(\s*)(-\s+)?([^\s:#][^:#]*?)\s*:/.exec(lines[i]);
      if (!m) continue;
      const ind = m[1].length;
      if (i > from && ind <= indent) break; // left the parent block
      if (m[3].replace(/^["']|["']$/g, "") === part && ind > indent) {
        hit = i;
        indent = ind;
        break;
      }
    }
    if (hit < 0) break;
    found = hit + 1;
    from = hit + 1;
  }
  return found;
}

/** @type {import("../router.js").Page} */
export async function submitPage(root) {
  const ctx = await getContext();
  const qosNames = ctx.qos_classes.map((q) => q.name);
  /** @type {FieldDef[]} */
  const fields = [
    { loc: "name", label: "Name", value: "gpt-tiny", help: "Lower case letters, digits, . _ -" },
    { loc: "team", label: "Team", options: ctx.teams.map((t) => t.name) },
    { loc: "recipe.name", label: "Recipe", value: "gpt" },
    { loc: "recipe.hyperparameters", label: "Hyperparameters", type: "textarea", rows: 5,
      value: "size: tiny\ncorpus: stdlib\nbatch_size: 8\nseq_len: 128\nlr: 0.003", help: "One `key: value` a line",
      parse: parseKeyValues },
    { loc: "steps", label: "Steps", type: "number", value: "60", parse: num },
    { loc: "resources.gpus", label: "GPUs", type: "number", value: "0", parse: num, help: "0 runs on CPU slots" },
    { loc: "resources.cpu_slots", label: "CPU slots", type: "number", value: "1", parse: num },
    { loc: "resources.gpu_type", label: "GPU type", value: "", help: "e.g. H200; empty = any", parse: str },
    { loc: "parallelism", label: "Parallelism", options: ["ddp", "fsdp", "auto"], value: "ddp" },
    { loc: "precision", label: "Precision", options: ["fp32", "bf16", "fp16", "auto"], value: "fp32" },
    { loc: "compile.mode", label: "Compile", options: ["off", "auto", "regional", "whole"], value: "off" },
    { loc: "checkpointing.every_steps", label: "Checkpoint every (steps)", type: "number", value: "20", parse: num },
    { loc: "sla.qos", label: "QoS class", options: qosNames, value: qosNames.includes("silver") ? "silver" : qosNames[0] },
    { loc: "sla.max_queue_wait_s", label: "Max queue wait (s)", type: "number", value: "600", parse: num },
    { loc: "time_limit_s", label: "Time limit (s)", type: "number", value: "", parse: num },
  ];

  /** @type {Map<string, {input: HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement, error: HTMLElement, def: FieldDef}>} */
  const controls = new Map();
  const formSummary = h("div", { id: "form-errors", class: "error-summary", tabindex: "-1", hidden: true });
  const form = h("form", { id: "submit-form", novalidate: true, "aria-labelledby": "form-title" },
    h("h2", { id: "form-title" }, "Form"), formSummary);
  const grid = h("div", { class: "form-grid" });
  for (const def of fields) {
    const id = fieldId(def.loc);
    const errorId = `${id}-error`;
    const helpId = def.help ? `${id}-help` : undefined;
    const described = [helpId, errorId].filter(Boolean).join(" ");
    /** @type {any} */
    let input;
    if (def.options) {
      input = h("select", { id, name: def.loc, "aria-describedby": described },
        def.options.map((o) => h("option", { value: o, selected: o === def.value }, o)));
    } else if (def.type === "textarea") {
      input = h("textarea", { id, name: def.loc, rows: def.rows ?? 3, spellcheck: "false", "aria-describedby": described });
      input.value = def.value ?? "";
    } else {
      input = h("input", { id, name: def.loc, type: def.type ?? "text", value: def.value ?? "", "aria-describedby": described,
        inputmode: def.type === "number" ? "decimal" : undefined });
    }
    const error = h("p", { id: errorId, class: "field-error", "data-loc": def.loc });
    controls.set(def.loc, { input, error, def });
    grid.append(h("div", { class: `field${def.type === "textarea" ? " wide" : ""}` },
      h("label", { for: id }, def.label), input, def.help ? h("p", { id: helpId, class: "help" }, def.help) : null, error));
  }
  // A team may use only the QoS classes an admin granted it: the choice follows the team.
  const teamSelect = /** @type {HTMLSelectElement} */ (controls.get("team")?.input);
  const qosSelect = /** @type {HTMLSelectElement} */ (controls.get("sla.qos")?.input);
  const fillQos = () => {
    const granted = ctx.teams.find((t) => t.name === teamSelect.value)?.qos_classes ?? qosNames;
    const allowed = qosNames.filter((n) => granted.includes(n));
    const keep = allowed.includes(qosSelect.value) ? qosSelect.value : allowed.includes("silver") ? "silver" : allowed[0];
    qosSelect.replaceChildren(...allowed.map((o) => h("option", { value: o, selected: o === keep }, o)));
  };
  teamSelect.addEventListener("change", fillQos);
  fillQos();
  const submitBtn = h("button", { type: "submit", class: "primary", id: "submit-form-button" }, "Submit job");
  form.append(grid, h("div", { class: "actions" }, submitBtn));

  // YAML editor
  const yamlInput = /** @type {HTMLTextAreaElement} */ (h("textarea", { id: "yaml", name: "yaml", rows: 24, spellcheck: "false",
    class: "code", "aria-describedby": "yaml-help yaml-errors" }));
  yamlInput.value = EXAMPLE_YAML.replace("team: default", `team: ${ctx.teams[0]?.name ?? "default"}`);
  const yamlErrors = h("ul", { id: "yaml-errors", class: "yaml-errors", "aria-live": "polite" });
  const yamlBtn = h("button", { type: "submit", class: "primary", id: "submit-yaml-button" }, "Submit YAML");
  const yamlForm = h("form", { id: "yaml-form", novalidate: true, "aria-labelledby": "yaml-title" },
    h("h2", { id: "yaml-title" }, "YAML"),
    h("label", { for: "yaml" }, "Job spec (YAML)"),
    h("p", { id: "yaml-help", class: "help" }, "The same schema as `kiln submit FILE`; with a `sweep:` section, a sweep (as `kiln sweep submit FILE`); see examples/ in the repository."),
    h("div", { class: "yaml-editor" }, yamlInput, yamlErrors),
    h("div", { class: "actions" }, yamlBtn));

  // Tabs (buttons with aria-pressed: simple, and every control is reachable with Tab)
  const tabForm = h("button", { type: "button", "aria-pressed": "true", "aria-controls": "submit-form" }, "Form");
  const tabYaml = h("button", { type: "button", "aria-pressed": "false", "aria-controls": "yaml-form" }, "YAML editor");
  const show = (/** @type {"form" | "yaml"} */ which) => {
    form.hidden = which !== "form";
    yamlForm.hidden = which !== "yaml";
    tabForm.setAttribute("aria-pressed", String(which === "form"));
    tabYaml.setAttribute("aria-pressed", String(which === "yaml"));
  };
  /** The form's spec: each field at its path, empty ones left out. */
  const formSpec = () => {
    /** @type {Record<string, any>} */
    const spec = {};
    for (const { input, def } of controls.values()) setPath(spec, def.loc, (def.parse ?? str)(input.value));
    return spec;
  };
  // The estimate follows whichever of the two is shown, as the user types.
  const estimate = estimatePanel(() => (yamlForm.hidden ? { json: formSpec() }
    : { text: yamlInput.value, contentType: "application/yaml" }));
  form.addEventListener("input", estimate.refresh);
  form.addEventListener("change", estimate.refresh);
  yamlInput.addEventListener("input", estimate.refresh);
  tabForm.addEventListener("click", () => { show("form"); estimate.refresh(); });
  tabYaml.addEventListener("click", () => { show("yaml"); estimate.refresh(); });
  show("form");
  estimate.refresh();

  root.append(
    pageHeader("Submit a job"),
    h("div", { class: "segmented", role: "group", "aria-label": "How to write the spec" }, tabForm, tabYaml),
    h("section", { class: "card" }, form, yamlForm),
    estimate.el,
  );

  const clearErrors = () => {
    for (const { input, error } of controls.values()) {
      error.textContent = "";
      input.removeAttribute("aria-invalid");
    }
    formSummary.hidden = true;
    replace(formSummary);
    replace(yamlErrors);
    yamlInput.removeAttribute("aria-invalid");
  };

  /**
   * The nearest field for an error path: `resources.gpus` itself, or a parent (`recipe.hyperparameters.lr`
   * -> `recipe.hyperparameters`).
   * @param {string} loc
   */
  const controlFor = (loc) => {
    let parts = loc.split(".");
    while (parts.length) {
      const c = controls.get(parts.join("."));
      if (c) return c;
      parts = parts.slice(0, -1);
    }
    return undefined;
  };

  /** @param {unknown} err */
  const showFormErrors = (err) => {
    const errors = err instanceof ApiError && err.errors.length ? err.errors : [{ loc: "", msg: err instanceof Error ? err.message : String(err) }];
    /** @type {HTMLElement | null} */
    let first = null;
    const unplaced = [];
    for (const e of errors) {
      const c = controlFor(e.loc);
      if (c) {
        const rest = e.loc.slice(c.def.loc.length).replace(/^\./, "");
        c.error.textContent = [c.error.textContent, rest ? `${rest}: ${e.msg}` : e.msg].filter(Boolean).join("; ");
        c.input.setAttribute("aria-invalid", "true");
        first ??= c.input;
      } else {
        unplaced.push(e);
      }
    }
    formSummary.hidden = false;
    replace(formSummary,
      h("p", { role: "alert" }, `The job was not submitted: ${errors.length} problem${errors.length > 1 ? "s" : ""}.`),
      unplaced.length ? h("ul", {}, unplaced.map((e) => h("li", {}, e.loc ? `${e.loc}: ${e.msg}` : e.msg))) : null);
    (first ?? formSummary).focus();
  };

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const spec = formSpec();
    submitBtn.setAttribute("disabled", "");
    try {
      const job = await api("/v1/jobs", { json: spec });
      navigate(`/jobs/${job.id}`);
    } catch (err) {
      showFormErrors(err);
    } finally {
      submitBtn.removeAttribute("disabled");
    }
  });

  yamlForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    yamlBtn.setAttribute("disabled", "");
    try {
      // A spec with a sweep section is a sweep (as `kiln sweep submit`): it lands on the sweep's page.
      const sweep = /^sweep\s*:/m.test(yamlInput.value);
      const made = await api(sweep ? "/v1/sweeps" : "/v1/jobs", { text: yamlInput.value, contentType: "application/yaml" });
      navigate(sweep ? `/sweeps/${made.id}` : `/jobs/${made.id}`);
    } catch (err) {
      const errors = err instanceof ApiError && err.errors.length ? err.errors : [{ loc: "", msg: err instanceof Error ? err.message : String(err) }];
      yamlInput.setAttribute("aria-invalid", "true");
      replace(yamlErrors, errors.map((e) => {
        const line = e.loc ? yamlLine(yamlInput.value, e.loc) : 0;
        const li = h("li", { "data-loc": e.loc }, line ? h("button", { type: "button", class: "link-button" }, `line ${line}`) : null,
          line ? " " : null, h("code", {}, e.loc || "spec"), `: ${e.msg}`);
        li.querySelector("button")?.addEventListener("click", () => selectLine(yamlInput, line));
        return li;
      }));
      yamlInput.focus();
    } finally {
      yamlBtn.removeAttribute("disabled");
    }
  });
}

/**
 * Put the caret on a line of a textarea and select it.
 * @param {HTMLTextAreaElement} ta
 * @param {number} line 1-based
 */
function selectLine(ta, line) {
  const lines = ta.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  ta.focus();
  ta.setSelectionRange(start, start + (lines[line - 1]?.length ?? 0));
}
