// Teams: quota used, borrowed and lent; GPU-hours against budget; fair-share usage against weight.

import { api } from "../api.js";
import { bar, fmtDuration, fmtNumber, fmtPercent, h, pageHeader, replace, showError, table } from "../dom.js";

/** @type {import("../router.js").Page} */
export async function teamsPage(root) {
  const body = h("div", { id: "teams", "aria-busy": "true" });
  root.append(pageHeader("Teams"), body);
  try {
    const data = await api("/v1/dashboard/teams");
    replace(body,
      h("p", { class: "muted" },
        `Fair share compares each team's recent usage (decayed with a ${fmtDuration(data.fair_share_half_life_s)} half-life) `
        + "with its share of the weights; a team above its share yields to the others."),
      data.teams.length ? null : h("p", {}, "You are not a member of any team."),
      h("div", { class: "grid two" }, data.teams.map((/** @type {any} */ t) => teamCard(t))));
  } catch (err) {
    showError(body, err);
  } finally {
    body.setAttribute("aria-busy", "false");
  }
}

/** @param {any} t */
function teamCard(t) {
  const id = `team-${t.name}`;
  const budget = t.gpu_hour_budget
    ? bar(t.gpu_hours, t.gpu_hour_budget, `${fmtNumber(t.gpu_hours)} / ${fmtNumber(t.gpu_hour_budget)} GPU-h`, "GPU-hours against budget")
    : h("span", {}, `${fmtNumber(t.gpu_hours)} GPU-h (no budget)`);
  return h("section", { class: "card team", "aria-labelledby": id, "data-team": t.name },
    h("h2", { id }, t.name, t.cohort ? h("span", { class: "muted" }, ` · cohort ${t.cohort}`) : null),
    h("dl", { class: "facts" },
      h("dt", {}, "Jobs"), h("dd", {}, `${t.active} running, ${t.waiting} waiting`),
      h("dt", {}, `GPU-hours (last ${fmtDuration(t.budget_period_s)})`), h("dd", {}, budget),
      h("dt", {}, "Fair share"),
      h("dd", {}, bar(t.usage_share, t.weight_share,
        `usage ${fmtPercent(t.usage_share)} of weight share ${fmtPercent(t.weight_share)} (weight ${t.fair_share_weight})`,
        "Fair-share usage against weight share"))),
    table(`Quota of ${t.name}`, [
      { title: "Type", cell: (/** @type {any} */ q) => q.gpu_type },
      { title: "Used / nominal", cell: (/** @type {any} */ q) => bar(q.used, q.nominal || null, `${q.used} / ${q.nominal}`, "Used against nominal quota") },
      { title: "Borrowed", cell: (/** @type {any} */ q) => `${q.borrowed}${q.borrowing_limit !== null ? ` (max ${q.borrowing_limit})` : ""}`, class: "num" },
      { title: "Lent", cell: (/** @type {any} */ q) => `${fmtNumber(q.lent)}${q.lending_limit !== null ? ` (max ${q.lending_limit})` : ""}`, class: "num" },
    ], t.quotas, "No quota set: this team runs only on what its cohort lends."));
}
