// Small DOM and formatting helpers shared by the pages. Text always goes in as text (no innerHTML).

/**
 * @typedef {string | number | Node | null | undefined | false} Child
 */

/**
 * Create an element. Attributes: `class`, `dataset` (object), `on*` (listeners), `for`, anything else
 * as an attribute (`true` -> present, `false`/`null`/`undefined` -> absent).
 * @param {string} tag
 * @param {Record<string, any>} [attrs]
 * @param {...(Child | Child[])} children
 * @returns {HTMLElement}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = String(value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "value" && "value" in el) /** @type {HTMLInputElement} */ (el).value = String(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/**
 * @param {Node} el
 * @param {Array<Child | Child[]>} children
 */
export function append(el, children) {
  for (const child of children.flat(2)) {
    if (child === null || child === undefined || child === false) continue;
    el.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/**
 * Replace an element's children.
 * @param {Element} el
 * @param {...(Child | Child[])} children
 */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/**
 * A table in a keyboard-scrollable wrapper (narrow screens scroll it sideways).
 * @template T
 * @param {string} label accessible name
 * @param {Array<{title: string, cell: (row: T) => Child | Child[], class?: string}>} columns
 * @param {T[]} rows
 * @param {string} [empty] text when there are no rows
 * @returns {HTMLElement}
 */
export function table(label, columns, rows, empty = "Nothing here yet.") {
  const head = h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.title)));
  const body = rows.length
    ? rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c.class }, c.cell(r)))))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty))];
  return h(
    "div",
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": label },
    h("table", {}, h("caption", { class: "visually-hidden" }, label), h("thead", {}, head), h("tbody", {}, body)),
  );
}

/**
 * A labelled bar: value against a limit (e.g. wait so far against the contract's maximum).
 * @param {number} value
 * @param {number | null | undefined} max
 * @param {string} text visible text
 * @param {string} label accessible name
 * @returns {HTMLElement}
 */
export function bar(value, max, text, label) {
  const ratio = max ? value / max : 0;
  const level = !max ? "none" : ratio >= 1 ? "bad" : ratio >= 0.75 ? "warn" : "ok";
  const fill = h("span", { class: "bar-fill" });
  fill.style.width = `${Math.min(100, ratio * 100).toFixed(1)}%`; // CSSOM: allowed by the CSP, unlike style=""
  return h(
    "div",
    { class: `bar bar-${level}`, role: "img", "aria-label": `${label}: ${text}` },
    fill,
    h("span", { class: "bar-text" }, text),
  );
}

/** @param {number | null | undefined} s seconds */
export function fmtDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "—";
  const sign = s < 0 ? "-" : "";
  s = Math.abs(s);
  if (s < 60) return `${sign}${s.toFixed(s < 10 ? 1 : 0)}s`;
  if (s < 3600) return `${sign}${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  if (s < 86400) return `${sign}${Math.floor(s / 3600)}h ${Math.round((s % 3600) / 60)}m`;
  return `${sign}${Math.floor(s / 86400)}d ${Math.round((s % 86400) / 3600)}h`;
}

/** @param {number | null | undefined} b bytes */
export function fmtBytes(b) {
  if (b === null || b === undefined || !Number.isFinite(b)) return "—";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(b) >= 1000 && i < units.length - 1) {
    b /= 1000;
    i++;
  }
  return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** @param {number | null | undefined} n */
export function fmtNumber(n, digits = 2) {
  if (n === null || n === undefined || !Number.isFinite(n)) return "—";
  if (Math.abs(n) >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (Math.abs(n) >= 1e4) return `${(n / 1e3).toFixed(1)}k`;
  return Number.isInteger(n) ? String(n) : n.toFixed(digits);
}

/**
 * An amount of a forecast (or its error) in its kind's unit: seconds, bytes or GPU-hours; `signed`: "+" when the job
 * came out later, bigger or slower than forecast.
 * @param {number | null | undefined} v @param {string} unit @param {boolean} [signed]
 */
export function fmtForecastAmount(v, unit, signed = false) {
  if (v === null || v === undefined) return "—";
  const plus = signed && v > 0 ? "+" : "";
  if (unit === "s") return plus + (Math.abs(v) < 1 ? `${(v * 1000).toFixed(0)} ms` : fmtDuration(v));
  if (unit === "bytes") return plus + fmtBytes(v);
  return plus + (Math.abs(v) < 1 ? v.toPrecision(2) : fmtNumber(v, 2));  // GPU-hours: a small job's are thousandths
}

/** @param {number | null | undefined} r ratio 0..1 */
export function fmtPercent(r) {
  return r === null || r === undefined || !Number.isFinite(r) ? "—" : `${(r * 100).toFixed(1)}%`;
}

/** @param {string | null | undefined} iso */
export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

/**
 * A time element with a machine-readable datetime.
 * @param {string | null | undefined} iso
 */
export function timeEl(iso) {
  return iso ? h("time", { datetime: iso }, fmtTime(iso)) : "—";
}

/** @param {string} state */
export function stateBadge(state) {
  return h("span", { class: `badge state-${state.toLowerCase()}` }, state);
}

/**
 * A page heading with a live status line, the usual top of a page.
 * @param {string} title
 * @param {...Child} extra
 */
export function pageHeader(title, ...extra) {
  return h("div", { class: "page-head" }, h("h1", { id: "page-title" }, title), ...extra);
}

/**
 * Show an error in a container, as an alert.
 * @param {Element} el
 * @param {unknown} err
 */
export function showError(el, err) {
  const msg = err instanceof Error ? err.message : String(err);
  replace(el, h("p", { class: "error", role: "alert" }, msg));
}

/** @param {string} text */
export function toast(text) {
  const el = document.getElementById("toast");
  if (!el) return;
  el.textContent = text;
  el.classList.add("show");
  window.setTimeout(() => el.classList.remove("show"), 4000);
}

const WINDOWS = [
  { value: "1:hour", label: "Last 24 hours, hourly" },
  { value: "7:day", label: "Last 7 days, daily" },
  { value: "30:day", label: "Last 30 days, daily" },
];

/**
 * The time-window picker of the charts' pages: a select of `days:bucket` values with `selected` chosen, and the
 * filter bar that labels it.
 * @param {string} id
 * @param {string} selected
 * @returns {{select: HTMLSelectElement, filters: HTMLElement}}
 */
export function windowPicker(id, selected) {
  const select = /** @type {HTMLSelectElement} */ (h("select", { id },
    WINDOWS.map((w) => h("option", { value: w.value, selected: w.value === selected }, w.label))));
  const filters = h("div", { class: "filters" }, h("div", { class: "field" }, h("label", { for: id }, "Window"), select));
  return { select, filters };
}

/** A time bucket on a chart's x axis. @param {number} ms epoch milliseconds */
export function fmtBucket(ms) {
  return new Date(ms).toLocaleDateString(undefined, { month: "short", day: "numeric", hour: "2-digit" });
}
