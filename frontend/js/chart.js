// A small SVG line chart: several series, nice ticks, markers, live appends, a table fallback for screen readers.

const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
const MAX_DRAWN = 1500; // points per series actually drawn; more are thinned keeping each bucket's min and max

/**
 * @typedef {[number, number]} Point  x, y
 * @typedef {{name: string, points: Point[], color?: string}} Series
 * @typedef {{x: number, label: string}} Marker  a vertical mark (e.g. a loss spike at a step)
 * @typedef {{
 *   id: string,
 *   title: string,
 *   xLabel?: string,
 *   yLabel?: string,
 *   xFormat?: (v: number) => string,
 *   yFormat?: (v: number) => string,
 *   yMin?: number,
 *   yMax?: number,
 *   height?: number,
 *   empty?: string,
 * }} ChartOptions
 */

/**
 * @param {string} tag
 * @param {Record<string, string | number>} attrs
 * @returns {SVGElement}
 */
function svg(tag, attrs = {}) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

/**
 * About `count` round tick values covering [min, max].
 * @param {number} min
 * @param {number} max
 * @param {number} count
 * @returns {number[]}
 */
export function niceTicks(min, max, count = 5) {
  if (!Number.isFinite(min) || !Number.isFinite(max)) return [];
  if (min === max) return [min];
  const raw = (max - min) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = (norm >= 5 ? 10 : norm >= 2 ? 5 : norm >= 1 ? 2 : 1) * mag;
  const ticks = [];
  for (let v = Math.ceil(min / step) * step; v <= max + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

/**
 * Thin a series to at most `limit` points, keeping each bucket's minimum and maximum (spikes stay visible).
 * @param {Point[]} points
 * @param {number} limit
 * @returns {Point[]}
 */
export function thin(points, limit = MAX_DRAWN) {
  if (points.length <= limit) return points;
  const buckets = Math.floor(limit / 2);
  const size = points.length / buckets;
  /** @type {Point[]} */
  const out = [];
  for (let b = 0; b < buckets; b++) {
    const slice = points.slice(Math.floor(b * size), Math.floor((b + 1) * size));
    if (!slice.length) continue;
    let lo = slice[0];
    let hi = slice[0];
    for (const p of slice) {
      if (p[1] < lo[1]) lo = p;
      if (p[1] > hi[1]) hi = p;
    }
    out.push(...(lo[0] <= hi[0] ? [lo, hi] : [hi, lo]));
  }
  return out;
}

const defaultFormat = (/** @type {number} */ v) =>
  Math.abs(v) >= 1e9 ? `${(v / 1e9).toPrecision(3)}G`
  : Math.abs(v) >= 1e6 ? `${(v / 1e6).toPrecision(3)}M`
  : Math.abs(v) >= 1e3 ? `${(v / 1e3).toPrecision(3)}k`
  : Number.isInteger(v) ? String(v) : v.toPrecision(3);

/** A line chart; create once, then call `setSeries` as data arrives. */
export class LineChart {
  /** @param {ChartOptions} opts */
  constructor(opts) {
    this.opts = opts;
    /** @type {Series[]} */
    this.series = [];
    /** @type {Marker[]} */
    this.markers = [];
    this.width = 640;
    this.height = opts.height ?? 220;
    this.el = document.createElement("figure");
    this.el.className = "chart";
    this.el.dataset.chart = opts.id;
    this.el.dataset.points = "0";
    const caption = document.createElement("figcaption");
    caption.textContent = opts.title;
    caption.id = `chart-${opts.id}-title`;
    this.svg = /** @type {SVGSVGElement} */ (svg("svg", {
      viewBox: `0 0 ${this.width} ${this.height}`,
      role: "img",
      "aria-labelledby": caption.id,
    }));
    this.legend = document.createElement("ul");
    this.legend.className = "legend";
    this.summary = document.createElement("p");
    this.summary.className = "visually-hidden";
    this.el.append(caption, this.svg, this.legend, this.summary);
    // Draw in the element's own pixels (text stays crisp and unstretched); redraw when its width changes.
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver(() => {
        const w = Math.round(this.svg.clientWidth);
        if (w > 0 && w !== this.width) this.render();
      }).observe(this.svg);
    }
    this.render();
  }

  /** @param {Series[]} series */
  setSeries(series) {
    this.series = series;
    this.render();
  }

  /** @param {Marker[]} markers */
  setMarkers(markers) {
    this.markers = markers;
    this.render();
  }

  render() {
    const { xFormat = defaultFormat, yFormat = defaultFormat } = this.opts;
    this.width = Math.round(this.svg.clientWidth) || this.width;
    this.height = Math.round(this.svg.clientHeight) || this.height;
    const W = this.width;
    const H = this.height;
    this.svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const pad = { l: 56, r: 12, t: 10, b: 30 };
    this.svg.replaceChildren();
    const all = this.series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1]));
    this.el.dataset.points = String(all.length);
    if (!all.length) {
      const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "chart-empty" });
      t.textContent = this.opts.empty ?? "No data yet";
      this.svg.append(t);
      this.legend.replaceChildren();
      this.summary.textContent = `${this.opts.title}: no data yet.`;
      return;
    }
    let [x0, x1] = [Infinity, -Infinity];
    let [y0, y1] = [Infinity, -Infinity];
    for (const [x, y] of all) {
      if (x < x0) x0 = x;
      if (x > x1) x1 = x;
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
    if (this.opts.yMin !== undefined) y0 = Math.min(y0, this.opts.yMin);
    if (this.opts.yMax !== undefined) y1 = Math.max(y1, this.opts.yMax);
    if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
    if (y0 === y1) [y0, y1] = [y0 - Math.abs(y0 || 1) * 0.1, y1 + Math.abs(y1 || 1) * 0.1];
    const sx = (/** @type {number} */ x) => pad.l + ((x - x0) / (x1 - x0)) * (W - pad.l - pad.r);
    const sy = (/** @type {number} */ y) => H - pad.b - ((y - y0) / (y1 - y0)) * (H - pad.t - pad.b);

    const grid = svg("g", { class: "chart-grid" });
    for (const v of niceTicks(y0, y1, 4)) {
      grid.append(svg("line", { x1: pad.l, x2: W - pad.r, y1: sy(v), y2: sy(v) }));
      const t = svg("text", { x: pad.l - 6, y: sy(v) + 4, "text-anchor": "end" });
      t.textContent = yFormat(v);
      grid.append(t);
    }
    for (const v of niceTicks(x0, x1, 5)) {
      const t = svg("text", { x: sx(v), y: H - pad.b + 16, "text-anchor": "middle" });
      t.textContent = xFormat(v);
      grid.append(t);
    }
    if (this.opts.xLabel) {
      const t = svg("text", { x: W - pad.r, y: H - 2, "text-anchor": "end", class: "chart-axis-label" });
      t.textContent = this.opts.xLabel;
      grid.append(t);
    }
    this.svg.append(grid);

    for (const m of this.markers) {
      if (m.x < x0 || m.x > x1) continue;
      const line = svg("line", { x1: sx(m.x), x2: sx(m.x), y1: pad.t, y2: H - pad.b, class: "chart-marker" });
      const title = svg("title");
      title.textContent = m.label;
      line.append(title);
      this.svg.append(line);
    }

    this.legend.replaceChildren();
    const described = [];
    this.series.forEach((s, i) => {
      const color = s.color ?? PALETTE[i % PALETTE.length];
      const pts = thin(s.points.filter((p) => Number.isFinite(p[0]) && Number.isFinite(p[1])));
      if (!pts.length) return;
      const d = pts.map((p, j) => `${j ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
      this.svg.append(svg("path", { d, class: "series", stroke: color, "data-series": s.name }));
      if (pts.length === 1) this.svg.append(svg("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 3, fill: color }));
      const li = document.createElement("li");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = color;
      li.append(sw, document.createTextNode(s.name));
      this.legend.append(li);
      const last = s.points[s.points.length - 1];
      described.push(`${s.name}: ${s.points.length} points, last ${yFormat(last[1])} at ${xFormat(last[0])}`);
    });
    this.summary.textContent = `${this.opts.title}. ${described.join("; ")}.`;
  }
}
