// Cluster: hosts and their GPUs, utilisation from the last samples, excluded hosts and why.

import { api } from "../api.js";
import { bar, fmtBytes, fmtDuration, h, pageHeader, replace, showError, table, timeEl } from "../dom.js";

const REFRESH_MS = 10000;

/** @type {import("../router.js").Page} */
export async function clusterPage(root) {
  const summary = h("dl", { class: "facts inline-facts", id: "cluster-summary" });
  const hostsEl = h("div", { id: "hosts" });
  const excludedEl = h("div", { id: "excluded" });
  root.append(
    pageHeader("Cluster"),
    h("section", { class: "card", "aria-label": "Totals" }, summary),
    h("section", { class: "card", "aria-labelledby": "hosts-title" }, h("h2", { id: "hosts-title" }, "Hosts"), hostsEl),
    h("section", { class: "card", "aria-labelledby": "gpus-title" }, h("h2", { id: "gpus-title" }, "GPUs"), h("div", { id: "gpus" })),
    h("section", { class: "card", "aria-labelledby": "excl-title" }, h("h2", { id: "excl-title" }, "Excluded hosts"), excludedEl),
  );
  const gpusEl = /** @type {HTMLElement} */ (root.querySelector("#gpus"));

  const load = async () => {
    try {
      const { hosts } = await api("/v1/dashboard/cluster");
      const gpus = hosts.flatMap((/** @type {any} */ host) => host.gpus.map((/** @type {any} */ g) => ({ ...g, host: host.name })));
      const up = hosts.filter((/** @type {any} */ x) => x.state === "UP" && !x.excluded).length;
      const busy = hosts.reduce((n, /** @type {any} */ x) => n + x.jobs.reduce((m, /** @type {any} */ j) => m + (j.gpus || 0), 0), 0);
      const slots = hosts.reduce((n, /** @type {any} */ x) => n + (x.cpu_slots || 0), 0);
      replace(summary,
        h("dt", {}, "Hosts up"), h("dd", {}, `${up} of ${hosts.length}`),
        h("dt", {}, "GPUs"), h("dd", {}, `${gpus.length} (${busy} allocated)`),
        h("dt", {}, "CPU slots"), h("dd", {}, String(slots)));
      replace(hostsEl, table("Hosts", [
        { title: "Host", cell: (/** @type {any} */ x) => x.name },
        { title: "State", cell: (/** @type {any} */ x) => h("span", { class: `badge host-${(x.excluded ? "EXCLUDED" : x.state).toLowerCase()}` }, x.excluded ? "EXCLUDED" : x.state) },
        { title: "GPUs", cell: (/** @type {any} */ x) => (x.gpus.length ? `${x.gpus.length} × ${x.gpus[0].model}` : "none"), class: "num" },
        { title: "CPU slots", cell: (/** @type {any} */ x) => x.cpu_slots, class: "num" },
        { title: "Heartbeat", cell: (/** @type {any} */ x) => (x.heartbeat_age_s === null ? "never" : `${fmtDuration(x.heartbeat_age_s)} ago`) },
        { title: "Running", cell: (/** @type {any} */ x) => x.jobs.length ? x.jobs.map((/** @type {any} */ j, /** @type {number} */ i) => [i ? ", " : "",
          j.job_id ? h("a", { href: `#/jobs/${j.job_id}` }, j.name) : j.name]) : h("span", { class: "muted" }, "idle") },
      ], hosts, "No host has registered. Start a worker: python -m workers --host NAME"));
      replace(gpusEl, table("GPUs", [
        { title: "Host", cell: (/** @type {any} */ g) => g.host },
        { title: "#", cell: (/** @type {any} */ g) => g.index, class: "num" },
        { title: "Model", cell: (/** @type {any} */ g) => g.model },
        { title: "Utilisation", cell: (/** @type {any} */ g) => typeof g.sample?.util_gpu === "number" ? bar(g.sample.util_gpu, 100, `${g.sample.util_gpu}%`, "GPU utilisation") : "—" },
        { title: "Memory", cell: (/** @type {any} */ g) => typeof g.sample?.mem_used_bytes === "number"
          ? bar(g.sample.mem_used_bytes, g.memory_bytes, `${fmtBytes(g.sample.mem_used_bytes)} / ${fmtBytes(g.memory_bytes)}`, "GPU memory used") : fmtBytes(g.memory_bytes) },
        { title: "Health", cell: (/** @type {any} */ g) => (g.healthy ? "healthy" : h("span", { class: "bad" }, "unhealthy")) },
      ], gpus, "No GPU in the cluster (CPU slots only)."));
      const excluded = hosts.filter((/** @type {any} */ x) => x.excluded);
      replace(excludedEl, table("Excluded hosts", [
        { title: "Host", cell: (/** @type {any} */ x) => x.name },
        { title: "Reason", cell: (/** @type {any} */ x) => x.exclusion_reason ?? "—" },
        { title: "Until", cell: (/** @type {any} */ x) => timeEl(x.excluded_until) },
      ], excluded, "No host is excluded."));
    } catch (err) {
      showError(hostsEl, err);
    }
  };
  await load();
  const timer = window.setInterval(() => !document.hidden && load(), REFRESH_MS);
  return () => window.clearInterval(timer);
}
