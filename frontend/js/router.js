// A hash router: `#/jobs/42` -> the job page with {id: "42"}. Each page returns a cleanup function.

/**
 * A page renders into `root` and returns what stops its timers and streams when the user leaves.
 * @typedef {(root: HTMLElement, params: Record<string, string>, query: URLSearchParams) =>
 *   (void | (() => void) | Promise<void | (() => void)>)} Page
 * @typedef {{path: string, page: Page, title: string, nav?: string, public?: boolean}} Route
 */

/**
 * @param {string} pattern e.g. `/jobs/:id`
 * @returns {RegExp}
 */
function compile(pattern) {
  const re = pattern.replace(/\//g, "\\/").replace(/:(\w+)/g, "(?<$1>[^/]+)");
  return new RegExp(`^${re}$`);
}

export class Router {
  /**
   * @param {HTMLElement} root
   * @param {Route[]} routes
   * @param {{isSignedIn: () => boolean, signInPath: string, defaultPath: string, onNavigate?: (r: Route) => void}} opts
   */
  constructor(root, routes, opts) {
    this.root = root;
    this.routes = routes.map((r) => ({ ...r, re: compile(r.path) }));
    this.opts = opts;
    /** @type {(() => void) | null} */
    this.cleanup = null;
    this.generation = 0;
    window.addEventListener("hashchange", () => this.resolve());
  }

  /** @param {string} path */
  go(path) {
    navigate(path);
  }

  async resolve() {
    const raw = location.hash.replace(/^#/, "") || this.opts.defaultPath;
    const [path, search = ""] = raw.split("?");
    const match = this.routes.map((r) => ({ r, m: r.re.exec(path) })).find((x) => x.m);
    if (!match) return this.go(this.opts.defaultPath);
    if (!match.r.public && !this.opts.isSignedIn()) return this.go(`${this.opts.signInPath}?next=${encodeURIComponent(raw)}`);

    this.cleanup?.();
    this.cleanup = null;
    const generation = ++this.generation;
    document.title = `${match.r.title} · kiln`;
    this.opts.onNavigate?.(match.r);
    this.root.replaceChildren();
    const stop = await match.r.page(this.root, { ...(match.m?.groups ?? {}) }, new URLSearchParams(search));
    if (generation !== this.generation) {
      stop?.(); // the user navigated away while the page was loading
      return;
    }
    this.cleanup = stop ?? null;
    // Move focus to the new page's heading so keyboard and screen-reader users land on the content.
    const heading = /** @type {HTMLElement | null} */ (this.root.querySelector("h1"));
    if (heading) {
      heading.tabIndex = -1;
      heading.focus({ preventScroll: true });
    }
  }
}

/**
 * Go to a dashboard path (`/jobs/42`); re-renders when already there.
 * @param {string} path
 */
export function navigate(path) {
  if (location.hash === `#${path}`) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else location.hash = path;
}
