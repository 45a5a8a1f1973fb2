// Webhooks: the hooks you manage and, for each, its delivery log (status, attempts, the receiver's last answer),
// refreshed every few seconds so a receiver coming back shows its backlog draining in order.

import { api, apiAll } from "../api.js";
import { h, pageHeader, replace, showError, table, timeEl } from "../dom.js";

const REFRESH_MS = 5000;

/** @type {import("../router.js").Page} */
export async function webhooksPage(root, params) {
  const listEl = h("div", { id: "webhooks", "aria-busy": "true" });
  const logEl = h("div", { id: "deliveries" });
  const selected = params.id ? Number(params.id) : null;
  root.append(
    pageHeader("Webhooks"),
    h("p", { class: "muted" },
      "Signed notifications when a job finishes, fails, is preempted or restarted, or breaks its SLA. "
      + "Create them with kiln webhooks create (docs/notifications.md)."),
    h("section", { class: "card", "aria-labelledby": "hooks-title" }, h("h2", { id: "hooks-title" }, "Webhooks"), listEl),
    ...(selected ? [h("section", { class: "card", "aria-labelledby": "log-title" },
      h("h2", { id: "log-title" }, `Deliveries of webhook ${selected}`), logEl)] : []),
  );

  const load = async () => {
    try {
      const hooks = await apiAll("/v1/webhooks");
      replace(listEl, table("Webhooks", [
        { title: "Id", cell: (/** @type {any} */ w) => h("a", { href: `#/webhooks/${w.id}` }, String(w.id)), class: "num" },
        { title: "Team", cell: (/** @type {any} */ w) => w.team },
        { title: "Job", cell: (/** @type {any} */ w) => (w.job_id ? h("a", { href: `#/jobs/${w.job_id}` }, String(w.job_id)) : "every job") },
        { title: "Events", cell: (/** @type {any} */ w) => w.events.join(", ") },
        { title: "Format", cell: (/** @type {any} */ w) => w.format },
        { title: "URL", cell: (/** @type {any} */ w) => h("code", {}, w.url) },
      ], hooks, "No webhook yet."));
      if (selected) {
        const rows = (await api(`/v1/webhooks/${selected}/deliveries?limit=100`)).items;
        replace(logEl, table(`Deliveries of webhook ${selected}`, [
          { title: "Id", cell: (/** @type {any} */ d) => String(d.id), class: "num" },
          { title: "Event", cell: (/** @type {any} */ d) => d.kind },
          { title: "Job", cell: (/** @type {any} */ d) => (d.payload?.job?.id ? h("a", { href: `#/jobs/${d.payload.job.id}` }, String(d.payload.job.id)) : "—") },
          { title: "Status", cell: (/** @type {any} */ d) => h("span", { class: `badge delivery-${d.status}` }, d.status) },
          { title: "Attempts", cell: (/** @type {any} */ d) => String(d.attempts), class: "num" },
          { title: "HTTP", cell: (/** @type {any} */ d) => (d.last_status_code ? String(d.last_status_code) : "—"), class: "num" },
          { title: "Created", cell: (/** @type {any} */ d) => timeEl(d.created_at) },
          { title: "Next try", cell: (/** @type {any} */ d) => (d.status === "pending" ? timeEl(d.next_attempt_at) : "—") },
          { title: "Last error", cell: (/** @type {any} */ d) => d.last_error ?? "" },
        ], rows, "Nothing sent yet."));
      }
    } catch (err) {
      showError(selected ? logEl : listEl, err);
    } finally {
      listEl.setAttribute("aria-busy", "false");
    }
  };
  await load();
  const timer = window.setInterval(() => !document.hidden && load(), REFRESH_MS);
  return () => window.clearInterval(timer);
}
