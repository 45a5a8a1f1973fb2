// Sign in with an API token. It is kept in sessionStorage: gone when the tab closes, never in a cookie.

import { ApiError, api, clearToken, setToken } from "../api.js";
import { h } from "../dom.js";
import { resetContext } from "../context.js";
import { navigate } from "../router.js";
import { finishSignIn, ssoConfig, startSignIn } from "../sso.js";

/** @type {import("../router.js").Page} */
export function signInPage(root, _params, query) {
  const error = h("p", { id: "token-error", class: "field-error", role: "alert" });
  const input = /** @type {HTMLInputElement} */ (
    h("input", {
      id: "token",
      name: "token",
      type: "password",
      autocomplete: "off",
      spellcheck: "false",
      required: true,
      "aria-describedby": "token-help token-error",
    })
  );
  const button = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    { class: "card signin", novalidate: true, "aria-labelledby": "page-title" },
    h("h1", { id: "page-title" }, "Sign in to kiln"),
    query.get("expired") ? h("p", { class: "notice" }, "Your session ended; sign in again.") : null,
    h("label", { for: "token" }, "API token"),
    input,
    h("p", { id: "token-help", class: "help" }, "Create one with `kiln tokens create` (or `kiln admin bootstrap` for the first admin); `kiln up` prints one."),
    error,
    button,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    error.textContent = "";
    const token = input.value.trim();
    if (!token) {
      error.textContent = "Enter your API token.";
      input.focus();
      return;
    }
    button.setAttribute("disabled", "");
    setToken(token);
    resetContext();
    try {
      await api("/v1/dashboard/context");
      navigate(query.get("next") || "/queue");
    } catch (err) {
      clearToken();
      error.textContent = err instanceof ApiError && err.status === 401 ? "That token is not valid." : String(err);
      input.setAttribute("aria-invalid", "true");
      input.focus();
    } finally {
      button.removeAttribute("disabled");
    }
  });
  root.append(form);
  input.focus();
  offerSso(form, error, query.get("next") || "/queue");
}

/**
 * Sign-in with the company's provider where kiln has one (KILN_OIDC_ISSUER), and the return from it.
 * @param {HTMLElement} form
 * @param {HTMLElement} error
 * @param {string} next
 */
async function offerSso(form, error, next) {
  try {
    const back = await finishSignIn();
    if (back) {
      resetContext();
      navigate(back);
      return;
    }
  } catch (err) {
    clearToken();
    error.textContent = `Sign-in failed: ${err instanceof Error ? err.message : String(err)}`;
  }
  const config = await ssoConfig();
  if (!config) return;
  const button = h("button", { type: "button", id: "sso", class: "primary" }, "Sign in with your organisation");
  button.addEventListener("click", () => startSignIn(config, next));
  const label = form.querySelector("label");
  form.insertBefore(h("div", { class: "sso" }, button, h("p", { class: "help" }, "or with an API token:")), label);
}
