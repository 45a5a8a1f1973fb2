// Line charts drawn by uPlot (frontend/vendor/uplot, loaded by index.html as the global `uPlot`): several series,
// round ticks that enclose every point, distinct colours for 20 and more series, the values under the cursor in
// the legend, drag across to zoom (double-click zooms out), markers, series of time buckets drawn across each
// bucket, and a text summary for screen readers.

const uPlot = /** @type {any} */ (window).uPlot;

// The first eight hand-picked; further series take hues a golden angle apart at alternating lightness, so no two
// of a sweep's jobs share a colour however many there are.
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
const HEIGHT = 220;
const Y_TICKS = 5; // about this many intervals on the y axis
const WHOLE_INCRS = Array.from({ length: 30 }, (_, i) => [1, 2, 5][i % 3] * 10 ** Math.floor(i / 3));

/**
 * @typedef {[number, number]} Point  x, y
 * @typedef {{name: string, points: Point[], color?: string}} Series
 * @typedef {{x: number, label: string}} Marker  a vertical mark (e.g. a loss spike at a step)
 * @typedef {{
 *   id: string,
 *   title: string,
 *   xLabel?: string,
 *   yLabel?: string,
 *   time?: boolean,
 *   xFormat?: (v: number) => string,
 *   yFormat?: (v: number) => string,
 *   yMin?: number,
 *   yMax?: number,
 *   bucketMs?: number,
 *   height?: number,
 *   empty?: string,
 * }} ChartOptions
 * `time`: x is a time in ms since the epoch (ticks on round times). `bucketMs`: each point stands for the bucket
 * [x, x + bucketMs) and is drawn across it.
 */

/**
 * The colour of the i-th series.
 * @param {number} i
 */
export function seriesColor(i) {
  if (i < PALETTE.length) return PALETTE[i];
  const k = i - PALETTE.length;
  const hue = Math.round((k * 137.508 + 17) % 360);
  return `hsl(${hue} ${[75, 60, 85][k % 3]}% ${[40, 30, 52][Math.floor(k / 3) % 3]}%)`;
}

/**
 * The smallest of 1, 2, 5 or 10 times a power of ten that is at least `raw`.
 * @param {number} raw
 */
function niceStep(raw) {
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  return (norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 5 ? 5 : 10) * mag;
}

/**
 * A range from one round tick to another that holds [min, max], and the step between its ticks. A single value
 * gets room around it (100 alone: 94 to 106 by 2).
 * @param {number} min
 * @param {number} max
 * @param {number} count  about this many intervals
 * @returns {{min: number, max: number, step: number}}
 */
export function niceScale(min, max, count = Y_TICKS) {
  if (min === max) {
    const pad = Math.abs(min) * 0.05 || 1;
    [min, max] = [min - pad, max + pad];
  }
  const step = niceStep((max - min) / count);
  const round = (/** @type {number} */ v) => Number(v.toPrecision(12));
  return { min: round(Math.floor(min / step) * step), max: round(Math.ceil(max / step) * step), step };
}

/**
 * Tick labels with as many decimals as their step needs (never `100 101 101` for 100, 100.5, 101), in k, M or G
 * when the values are that large.
 * @param {number[]} values
 * @param {number} step
 * @returns {string[]}
 */
export function tickLabels(values, step) {
  const big = Math.max(...values.map(Math.abs));
  const [div, suffix] = big >= 1e9 ? [1e9, "G"] : big >= 1e6 ? [1e6, "M"] : big >= 1e3 ? [1e3, "k"] : [1, ""];
  const decimals = Math.min(12, Math.max(0, Math.ceil(-Math.log10(step / div) - 1e-9)));
  return values.map((v) => `${(v / div).toFixed(decimals)}${suffix}`);
}

/** @param {number} v */
const defaultFormat = (v) =>
  Math.abs(v) >= 1e9 ? `${(v / 1e9).toPrecision(3)}G`
  : Math.abs(v) >= 1e6 ? `${(v / 1e6).toPrecision(3)}M`
  : Math.abs(v) >= 1e3 ? `${(v / 1e3).toPrecision(3)}k`
  : Number.isInteger(v) ? String(v) : v.toPrecision(4);

/**
 * Each point drawn as a flat segment across its bucket [x, x + bucket), joined to the next bucket when they touch.
 * @param {number} bucket
 */
function bucketPaths(bucket) {
  return (/** @type {any} */ u, /** @type {number} */ si, /** @type {number} */ i0, /** @type {number} */ i1) => {
    const stroke = new Path2D();
    const xs = u.data[0];
    const ys = u.data[si];
    let prev = -1;
    for (let i = i0; i <= i1; i++) {
      if (ys[i] === null || ys[i] === undefined) continue;
      const x0 = u.valToPos(xs[i], "x", true);
      const y = u.valToPos(ys[i], "y", true);
      if (prev >= 0 && xs[prev] + bucket === xs[i]) stroke.lineTo(x0, y); // it touches the previous bucket: join them
      else stroke.moveTo(x0, y);
      stroke.lineTo(u.valToPos(xs[i] + bucket, "x", true), y);
      prev = i;
    }
    return { stroke, fill: null, clip: null, band: null, gaps: null, flags: 0 };
  };
}

/**
 * The window an answer of the API covers, from its first bucket to now (or the end of its last bucket).
 * @param {{start: string, bucket_s: number, series: Array<{points: Array<{t: string}>}>}} data
 * @returns {[number, number]}
 */
export function windowRange(data) {
  const ends = data.series.flatMap((s) => s.points.map((p) => Date.parse(p.t) + data.bucket_s * 1000));
  return [Date.parse(data.start), Math.max(Date.now(), ...ends)];
}

/** A line chart; create once, then call `setSeries` as data arrives. */
export class LineChart {
  /** @param {ChartOptions} opts */
  constructor(opts) {
    this.opts = opts;
    /** @type {Series[]} */
    this.series = [];
    /** @type {Marker[]} */
    this.markers = [];
    /** @type {[number, number] | null} */
    this.xRange = null;
    /** @type {any} */
    this.plot = null;
    this.plotKey = "";
    this.zoomed = false;
    this.yStep = 1;
    this.el = document.createElement("figure");
    this.el.className = "chart";
    this.el.dataset.chart = opts.id;
    this.el.dataset.points = "0";
    this.el.dataset.series = "0";
    Object.assign(this.el, { chart: this }); // for the browser tests
    const caption = document.createElement("figcaption");
    caption.textContent = opts.title;
    caption.id = `chart-${opts.id}-title`;
    this.box = document.createElement("div");
    this.box.className = "chart-plot";
    this.emptyEl = document.createElement("p");
    this.emptyEl.className = "chart-empty";
    this.summary = document.createElement("p");
    this.summary.className = "visually-hidden";
    this.el.append(caption, this.box, this.emptyEl, this.summary);
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver(() => {
        const w = Math.round(this.box.clientWidth);
        if (this.plot && w > 0 && w !== this.plot.width) this.plot.setSize({ width: w, height: this.height() });
      }).observe(this.box);
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
    this.plot?.redraw(false, false);
  }

  /**
   * The x range to show whatever the data (a window of time: its buckets without jobs stay empty).
   * @param {[number, number] | null} range
   */
  setXRange(range) {
    this.xRange = range;
    this.render();
  }

  height() {
    return this.opts.height ?? (window.matchMedia?.("(max-width: 640px)").matches ? 180 : HEIGHT);
  }

  render() {
    const { xFormat = defaultFormat, yFormat = defaultFormat } = this.opts;
    const finite = (/** @type {Point} */ p) => Number.isFinite(p[0]) && Number.isFinite(p[1]);
    const shown = this.series.map((s) => ({ ...s, points: s.points.filter(finite) })).filter((s) => s.points.length);
    const total = shown.reduce((n, s) => n + s.points.length, 0);
    this.el.dataset.points = String(total);
    this.el.dataset.series = String(shown.length);
    this.emptyEl.textContent = total ? "" : (this.opts.empty ?? "No data yet");
    this.emptyEl.hidden = total > 0;
    this.box.hidden = !total;
    if (!total) {
      this.summary.textContent = `${this.opts.title}: no data yet.`;
      return;
    }
    const data = align(shown, this.xRange);
    const key = [this.opts.bucketMs ?? "", ...shown.map((s) => s.name)].join("\u0000"); // a new bucket size redraws
    if (!this.plot || key !== this.plotKey) {
      this.plot?.destroy();
      this.plotKey = key;
      this.zoomed = false;
      this.plot = new uPlot(this.options(shown), data, this.box);
      const canvas = this.box.querySelector("canvas");
      canvas?.setAttribute("role", "img");
      canvas?.setAttribute("aria-labelledby", `chart-${this.opts.id}-title`);
      this.box.querySelector(".u-over")?.setAttribute("title", "Drag across to zoom in; double-click to zoom out");
    } else {
      this.plot.setData(data, !this.zoomed); // live points keep a zoom the user chose
    }
    const described = shown.map((s) => {
      const last = s.points[s.points.length - 1];
      return `${s.name}: ${s.points.length} points, last ${yFormat(last[1])} at ${xFormat(last[0])}`;
    });
    const marks = this.markers.map((m) => m.label);
    this.summary.textContent = `${this.opts.title}. ${described.join("; ")}.${marks.length ? ` Marked: ${marks.join("; ")}.` : ""}`;
  }

  /**
   * uPlot's options for these series.
   * @param {Series[]} shown
   */
  options(shown) {
    const o = this.opts;
    const css = getComputedStyle(document.documentElement);
    const muted = css.getPropertyValue("--muted").trim() || "#5b6472";
    const line = css.getPropertyValue("--line").trim() || "#d9dde3";
    const bad = css.getPropertyValue("--bad").trim() || "#b91c1c";
    const xFormat = o.xFormat ?? (o.time ? (/** @type {number} */ v) => new Date(v).toLocaleString() : defaultFormat);
    const yFormat = o.yFormat ?? defaultFormat;
    const integerX = shown.every((s) => s.points.every((p) => Number.isInteger(p[0])));
    const axis = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 }, font: "11px system-ui, sans-serif" };
    return {
      width: Math.round(this.box.clientWidth) || 640,
      height: this.height(),
      ms: 1,
      cursor: { drag: { x: true, y: false, setScale: true }, points: { size: 6 } },
      legend: { live: true },
      scales: {
        x: { time: Boolean(o.time) },
        y: {
          range: (/** @type {any} */ _u, /** @type {number | null} */ lo, /** @type {number | null} */ hi) => {
            if (lo === null || hi === null) [lo, hi] = [o.yMin ?? 0, o.yMax ?? 1]; // nothing in view
            const s = niceScale(Math.min(lo, o.yMin ?? lo), Math.max(hi, o.yMax ?? hi));
            this.yStep = s.step;
            return [s.min, s.max];
          },
        },
      },
      axes: [
        { ...axis, label: o.xLabel, labelSize: o.xLabel ? 18 : 0, labelFont: "italic 11px system-ui, sans-serif",
          ...(o.time ? {} : {
            // steps are whole numbers: no tick at step 1.5
            ...(integerX ? { incrs: WHOLE_INCRS } : {}),
            values: (/** @type {any} */ _u, /** @type {number[]} */ ticks, /** @type {number} */ _i,
              /** @type {number} */ _space, /** @type {number} */ incr) => (o.xFormat ? ticks.map(o.xFormat) : tickLabels(ticks, incr)),
          }) },
        { ...axis, size: 56, label: o.yLabel, labelSize: o.yLabel ? 18 : 0,
          splits: (/** @type {any} */ u) => {
            const { min, max } = u.scales.y;
            const out = [];
            for (let v = min; v <= max + this.yStep * 1e-9; v += this.yStep) out.push(Number(v.toPrecision(12)));
            return out;
          },
          values: (/** @type {any} */ _u, /** @type {number[]} */ ticks) =>
            (o.yFormat ? ticks.map(o.yFormat) : tickLabels(ticks, this.yStep)) },
      ],
      series: [
        { label: o.xLabel ?? (o.time ? "time" : "x"), value: (/** @type {any} */ _u, /** @type {number | null} */ v) => (v === null ? "—" : xFormat(v)) },
        ...shown.map((s, i) => ({
          label: s.name,
          stroke: s.color ?? seriesColor(i),
          width: 1.8,
          spanGaps: !o.bucketMs,
          value: (/** @type {any} */ _u, /** @type {number | null} */ v) => (v === null || v === undefined ? "—" : yFormat(v)),
          ...(o.bucketMs ? { paths: bucketPaths(o.bucketMs), points: { show: false } } : {}),
        })),
      ],
      hooks: {
        setScale: [(/** @type {any} */ u, /** @type {string} */ scale) => {
          if (scale !== "x") return;
          // zoomed in while the x scale leaves data out; a double-click back to all of it follows live points again
          const xs = u.data[0];
          this.zoomed = u.scales.x.min > xs[0] || u.scales.x.max < xs[xs.length - 1];
          this.el.dataset.xMin = String(u.scales.x.min);
          this.el.dataset.xMax = String(u.scales.x.max);
        }],
        draw: [(/** @type {any} */ u) => this.drawMarkers(u, bad)],
      },
    };
  }

  /**
   * Dashed vertical lines at the markers.
   * @param {any} u
   * @param {string} color
   */
  drawMarkers(u, color) {
    const { ctx, bbox } = u;
    ctx.save();
    ctx.strokeStyle = color;
    ctx.setLineDash([3 * devicePixelRatio, 3 * devicePixelRatio]);
    ctx.lineWidth = devicePixelRatio;
    for (const m of this.markers) {
      if (m.x < u.scales.x.min || m.x > u.scales.x.max) continue;
      const x = Math.round(u.valToPos(m.x, "x", true));
      ctx.beginPath();
      ctx.moveTo(x, bbox.top);
      ctx.lineTo(x, bbox.top + bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  }
}

/**
 * uPlot's aligned columns: the x values of every series, sorted, and each series' y at them (null where it has
 * none). `range`: its ends are added as x values, so the axis spans it.
 * @param {Series[]} series
 * @param {[number, number] | null} range
 * @returns {(number | null)[][]}
 */
function align(series, range) {
  const xs = new Set(series.flatMap((s) => s.points.map((p) => p[0])));
  if (range) range.forEach((x) => xs.add(x));
  const x = [...xs].sort((a, b) => a - b);
  const index = new Map(x.map((v, i) => [v, i]));
  const columns = series.map((s) => {
    /** @type {(number | null)[]} */
    const col = new Array(x.length).fill(null);
    for (const [px, py] of s.points) col[/** @type {number} */ (index.get(px))] = py;
    return col;
  });
  return [x, ...columns];
}
