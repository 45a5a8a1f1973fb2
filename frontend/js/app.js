// The dashboard's entry point: the signed-in context, navigation, and the routes.

import { api, clearToken, getToken, setUnauthorizedHandler } from "./api.js";
import { Router } from "./router.js";
import { getContext, resetContext } from "./context.js";
import { signInPage } from "./pages/signin.js";
import { endSession } from "./sso.js";
import { queuePage } from "./pages/queue.js";
import { jobPage } from "./pages/job.js";
import { submitPage } from "./pages/submit.js";
import { teamsPage } from "./pages/teams.js";
import { slaPage } from "./pages/sla.js";
import { clusterPage } from "./pages/cluster.js";
import { costPage } from "./pages/cost.js";
import { webhooksPage } from "./pages/webhooks.js";
import { sweepsPage } from "./pages/sweeps.js";

const root = /** @type {HTMLElement} */ (document.getElementById("main"));
const nav = /** @type {HTMLElement} */ (document.getElementById("nav"));
const who = /** @type {HTMLElement} */ (document.getElementById("who"));

const router = new Router(
  root,
  [
    { path: "/signin", page: signInPage, title: "Sign in", public: true },
    { path: "/queue", page: queuePage, title: "Queue", nav: "queue" },
    { path: "/jobs/:id", page: jobPage, title: "Job", nav: "queue" },
    { path: "/submit", page: submitPage, title: "Submit", nav: "submit" },
    { path: "/sweeps", page: sweepsPage, title: "Sweeps", nav: "sweeps" },
    { path: "/sweeps/:id", page: sweepsPage, title: "Sweep", nav: "sweeps" },
    { path: "/teams", page: teamsPage, title: "Teams", nav: "teams" },
    { path: "/sla", page: slaPage, title: "SLA", nav: "sla" },
    { path: "/cluster", page: clusterPage, title: "Cluster", nav: "cluster" },
    { path: "/cost", page: costPage, title: "Cost", nav: "cost" },
    { path: "/webhooks", page: webhooksPage, title: "Webhooks", nav: "webhooks" },
    { path: "/webhooks/:id", page: webhooksPage, title: "Webhook", nav: "webhooks" },
  ],
  {
    isSignedIn: () => getToken() !== null,
    signInPath: "/signin",
    defaultPath: "/queue",
    onNavigate: (route) => {
      const signedIn = getToken() !== null;
      nav.hidden = !signedIn;
      who.hidden = !signedIn;
      for (const a of nav.querySelectorAll("a")) {
        if (a.dataset.nav === route.nav) a.setAttribute("aria-current", "page");
        else a.removeAttribute("aria-current");
      }
      if (signedIn) {
        getContext()
          .then((ctx) => {
            const el = document.getElementById("who-name");
            if (el) el.textContent = ctx.user.is_admin ? `${ctx.user.name} (admin)` : ctx.user.name;
          })
          .catch(() => {});
      }
    },
  },
);

async function signOut() {
  await endSession();
  clearToken();
  resetContext();
  router.go("/signin");
}

setUnauthorizedHandler(() => {
  clearToken();
  resetContext();
  if (!location.hash.startsWith("#/signin")) router.go("/signin?expired=1");
});

document.getElementById("sign-out")?.addEventListener("click", signOut);
router.resolve();
