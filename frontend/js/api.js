// The API client: bearer token from sessionStorage, problem+json errors, SSE (stream tickets) with a polling fallback.

const TOKEN_KEY = "kiln.token";

/**
 * One field error of a problem+json response.
 * @typedef {{loc: string, msg: string}} FieldError
 */

/** An error answered by the API (RFC 9457 problem+json), or a network failure (status 0). */
export class ApiError extends Error {
  /**
   * @param {number} status
   * @param {string} message
   * @param {FieldError[]} errors field errors, `loc` as a dotted path (`resources.gpus`)
   */
  constructor(status, message, errors = []) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.errors = errors;
  }
}

/** @returns {string | null} */
export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** @param {string} token */
export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/**
 * A query string; arrays repeat the key (`state=QUEUED&state=RUNNING`), empty values are left out.
 * @param {Record<string, string | number | boolean | null | undefined | Array<string | number>>} params
 * @returns {string}
 */
export function qs(params) {
  const sp = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value === null || value === undefined || value === "") continue;
    if (Array.isArray(value)) value.forEach((v) => sp.append(key, String(v)));
    else sp.append(key, String(value));
  }
  const s = sp.toString();
  return s ? `?${s}` : "";
}

/**
 * A field path as a dotted string. Accepts `"resources.gpus"` and FastAPI's `["body", "resources", "gpus"]`.
 * @param {unknown} loc
 * @returns {string}
 */
export function normalizeLoc(loc) {
  let parts = Array.isArray(loc) ? loc.map(String) : String(loc ?? "").split(".");
  while (parts.length && ["body", "spec", "$"].includes(parts[0])) parts = parts.slice(1);
  return parts.join(".");
}

/**
 * @param {Response} res
 * @returns {Promise<ApiError>}
 */
async function toError(res) {
  let body = null;
  try {
    body = await res.json();
  } catch {
    /* not JSON */
  }
  /** @type {FieldError[]} */
  let errors = [];
  if (body && Array.isArray(body.errors)) {
    errors = body.errors.map((e) => ({ loc: normalizeLoc(e.loc), msg: String(e.msg ?? e.message ?? "") }));
  } else if (body && Array.isArray(body.detail)) {
    errors = body.detail.map((e) => ({ loc: normalizeLoc(e.loc), msg: String(e.msg ?? "") }));
  }
  const message =
    (body && typeof body.detail === "string" && body.detail) ||
    (body && body.title) ||
    `${res.status} ${res.statusText}`;
  return new ApiError(res.status, message, errors);
}

/** Called on 401 so the app can send the user back to sign-in. */
let onUnauthorized = () => {};

/** @param {() => void} fn */
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

/**
 * Call the API.
 * @param {string} path e.g. `/v1/jobs`
 * @param {{method?: string, json?: unknown, text?: string, contentType?: string, signal?: AbortSignal}} [opts]
 * @returns {Promise<any>}
 */
export async function api(path, opts = {}) {
  /** @type {Record<string, string>} */
  const headers = { Accept: "application/json, application/problem+json" };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  /** @type {BodyInit | undefined} */
  let body;
  if (opts.json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(opts.json);
  } else if (opts.text !== undefined) {
    headers["Content-Type"] = opts.contentType ?? "text/plain";
    body = opts.text;
  }
  let res;
  try {
    res = await fetch(path, { method: opts.method ?? (body ? "POST" : "GET"), headers, body, signal: opts.signal });
  } catch (err) {
    if (err instanceof DOMException && err.name === "AbortError") throw err;
    throw new ApiError(0, "the API cannot be reached");
  }
  if (res.status === 401) {
    const err = await toError(res);
    onUnauthorized();
    throw err;
  }
  if (!res.ok) throw await toError(res);
  if (res.status === 204) return null;
  const type = res.headers.get("content-type") ?? "";
  return type.includes("json") ? res.json() : res.text();
}

/**
 * Every item of a list endpoint: its pages, one after another, following `next_cursor` (docs/api.md, Pagination).
 * @param {string} path e.g. `/v1/webhooks` (may carry a query already)
 * @returns {Promise<any[]>}
 */
export async function apiAll(path) {
  /** @type {any[]} */
  const items = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor);
  return items;
}

/**
 * Follow a server-sent event stream. EventSource cannot send headers, and a token never goes into a URL (access
 * logs keep URLs), so each connection first gets a short-lived ticket for this one stream
 * (`POST /v1/stream-tickets`) and passes that as `?ticket=`. A connection that drops is opened again with a fresh
 * ticket, resuming right after the last event id seen (`last_event_id`): nothing is missed or shown twice. The
 * server ends a stream whose token was revoked, or whose user left the team, with `end` `{"reason":
 * "unauthorized"}`: the app then signs out. If the stream cannot be opened at all, `poll` is called every
 * `intervalMs` instead: live updates degrade to polling, never to nothing.
 *
 * @param {string} path SSE endpoint, with its own query string if any
 * @param {{
 *   onMessage: (type: string, data: string, lastEventId: string) => void,
 *   events?: string[],
 *   poll?: () => Promise<void>,
 *   intervalMs?: number,
 *   onModeChange?: (mode: "sse" | "polling" | "closed") => void,
 * }} handlers
 * @returns {() => void} stop
 */
export function follow(path, handlers) {
  const { onMessage, events = [], poll, intervalMs = 2000, onModeChange = () => {} } = handlers;
  let stopped = false;
  let opened = false;
  let lastId = "";
  /** @type {EventSource | null} */
  let source = null;
  /** @type {number | undefined} */
  let timer;

  const startPolling = () => {
    if (stopped || timer !== undefined || !poll) return;
    onModeChange("polling");
    const tick = async () => {
      if (stopped) return;
      try {
        await poll();
      } catch {
        /* the next tick tries again */
      }
      if (!stopped) timer = window.setTimeout(tick, intervalMs);
    };
    tick();
  };

  const reopenLater = () => {
    timer = window.setTimeout(() => {
      timer = undefined;
      open();
    }, intervalMs);
  };

  const open = async () => {
    if (stopped) return;
    let ticket;
    try {
      ticket = (await api("/v1/stream-tickets", { json: { path: path.split("?")[0] } })).ticket;
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return; // signed out: the app has gone to sign-in
      if (opened) reopenLater(); // the API is away for a moment: try again
      else startPolling();
      return;
    }
    if (stopped) return;
    const sep = path.includes("?") ? "&" : "?";
    const es = new EventSource(`${path}${sep}${qs({ ticket, last_event_id: lastId }).slice(1)}`);
    source = es;
    es.onopen = () => {
      opened = true;
      onModeChange("sse");
    };
    const handle = (/** @type {MessageEvent} */ ev) => {
      if (stopped) return;
      if (ev.lastEventId) lastId = ev.lastEventId;
      if (ev.type === "end" && String(ev.data).includes('"reason":"unauthorized"')) {
        stop();
        onUnauthorized();
        return;
      }
      onMessage(ev.type, ev.data, ev.lastEventId);
    };
    es.onmessage = handle;
    events.forEach((name) => es.addEventListener(name, handle));
    es.onerror = () => {
      if (stopped) return;
      es.close();
      source = null;
      if (!opened) startPolling(); // never opened (refused, 404, no SSE): poll instead
      else reopenLater(); // dropped: a new ticket, resuming after the last event seen
    };
  };

  const stop = () => {
    stopped = true;
    source?.close();
    if (timer !== undefined) window.clearTimeout(timer);
    onModeChange("closed");
  };

  if (typeof EventSource === "undefined") startPolling();
  else open();
  return stop;
}

/**
 * The `data` of each event named `event` in a complete text/event-stream body (for polling an SSE endpoint).
 * @param {string} body
 * @param {string} event
 * @returns {string[]}
 */
export function parseEventStream(body, event) {
  const out = [];
  for (const block of body.split(/\r?\n\r?\n/)) {
    let type = "message";
    const data = [];
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith("event:")) type = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (data.length && type === event) out.push(data.join("\n"));
  }
  return out;
}
