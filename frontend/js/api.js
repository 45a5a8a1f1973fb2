// The API client: bearer token from sessionStorage, problem+json errors, SSE with a polling fallback.

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
 * Follow a server-sent event stream. EventSource cannot send headers, so the token travels as the
 * `access_token` query parameter (accepted on SSE endpoints only).
 *
 * A `resumable` stream honours Last-Event-ID, so the browser's own reconnection is left to do its job. A stream
 * that replays from the start is reopened by us after `onReset` (the caller clears what it showed). If the stream
 * cannot be opened at all, `poll` is called every `intervalMs` instead: live updates degrade to polling, never
 * to nothing.
 *
 * @param {string} path SSE endpoint
 * @param {{
 *   onMessage: (type: string, data: string, lastEventId: string) => void,
 *   events?: string[],
 *   resumable?: boolean,
 *   onReset?: () => void,
 *   poll?: () => Promise<void>,
 *   intervalMs?: number,
 *   onModeChange?: (mode: "sse" | "polling" | "closed") => void,
 * }} handlers
 * @returns {() => void} stop
 */
export function follow(path, handlers) {
  const { onMessage, events = [], resumable = true, onReset = () => {}, poll, intervalMs = 2000,
    onModeChange = () => {} } = handlers;
  let stopped = false;
  let opened = false;
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

  const open = () => {
    if (stopped) return;
    const sep = path.includes("?") ? "&" : "?";
    const es = new EventSource(`${path}${sep}access_token=${encodeURIComponent(getToken() ?? "")}`);
    source = es;
    es.onopen = () => {
      opened = true;
      onModeChange("sse");
    };
    const handle = (/** @type {MessageEvent} */ ev) => {
      if (!stopped) onMessage(ev.type, ev.data, ev.lastEventId);
    };
    es.onmessage = handle;
    events.forEach((name) => es.addEventListener(name, handle));
    es.onerror = () => {
      if (stopped) return;
      if (!opened || es.readyState === EventSource.CLOSED) {
        // Never opened (refused, 401/404, no SSE) or closed for good: poll instead.
        es.close();
        source = null;
        startPolling();
      } else if (!resumable) {
        // The server would replay from the start: start over cleanly rather than show lines twice.
        es.close();
        source = null;
        timer = window.setTimeout(() => {
          timer = undefined;
          onReset();
          open();
        }, intervalMs);
      }
    };
  };

  if (typeof EventSource === "undefined") startPolling();
  else open();

  return () => {
    stopped = true;
    source?.close();
    if (timer !== undefined) window.clearTimeout(timer);
    onModeChange("closed");
  };
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
