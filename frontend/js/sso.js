// Sign-in with the company's OpenID provider: authorization code flow with PKCE (RFC 7636), state and nonce.
// The browser holds the verifier, state and nonce in sessionStorage for the one round trip to the provider; kiln's
// API exchanges the code (with its client secret) and checks the ID token (signature, iss, aud, exp, nonce), then
// answers with a kiln token, which is kept as a pasted one is (sessionStorage, never a cookie).

import { ApiError, api, setToken } from "./api.js";

const FLOW_KEY = "kiln.sso";
// The id of the token a sign-in issued: signing out revokes it (a pasted token is the user's to keep).
const SESSION_KEY = "kiln.sso.token";

/**
 * @typedef {{issuer: string, client_id: string, scopes: string, authorization_endpoint: string}} SsoConfig
 */

/** @returns {Promise<SsoConfig | null>} the provider, or null when sign-in with one is off or down */
export async function ssoConfig() {
  try {
    const res = await fetch("/v1/auth/oidc", { headers: { Accept: "application/json" } });
    const config = res.ok ? await res.json() : null;
    return config?.enabled ? config : null;
  } catch {
    return null;
  }
}

/** @param {number} bytes */
function randomText(bytes) {
  return base64url(crypto.getRandomValues(new Uint8Array(bytes)));
}

/** @param {Uint8Array} data */
function base64url(data) {
  return btoa(String.fromCharCode(...data)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function redirectUri() {
  return `${location.origin}/`;
}

/**
 * Send the browser to the provider's sign-in page.
 * @param {SsoConfig} config
 * @param {string} next the dashboard path to open once signed in
 */
export async function startSignIn(config, next) {
  const verifier = randomText(32);
  const challenge = base64url(new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier))));
  const flow = { state: randomText(16), nonce: randomText(16), verifier, next, issuer: config.issuer };
  sessionStorage.setItem(FLOW_KEY, JSON.stringify(flow));
  const params = new URLSearchParams({
    response_type: "code",
    client_id: config.client_id,
    redirect_uri: redirectUri(),
    scope: config.scopes,
    state: flow.state,
    nonce: flow.nonce,
    code_challenge: challenge,
    code_challenge_method: "S256",
  });
  location.assign(`${config.authorization_endpoint}?${params}`);
}

/**
 * Finish a sign-in when the provider has sent the browser back (`/?code=...&state=...`): the code goes to kiln's
 * API, whose token is kept. The code leaves the address bar at once, whatever happens.
 * @returns {Promise<string | null>} the path to open, or null when this page load is no sign-in's return
 */
export async function finishSignIn() {
  const params = new URLSearchParams(location.search);
  if (!params.has("state")) return null;
  const flow = JSON.parse(sessionStorage.getItem(FLOW_KEY) ?? "null");
  sessionStorage.removeItem(FLOW_KEY);
  history.replaceState(null, "", `${location.pathname}${location.hash}`);
  if (params.get("error")) throw new Error(`the provider refused: ${params.get("error_description") || params.get("error")}`);
  if (!flow || flow.state !== params.get("state")) throw new Error("this sign-in was not started here; sign in again");
  if (params.get("iss") && params.get("iss") !== flow.issuer) throw new Error("the answer came from another provider");
  const res = await fetch("/v1/auth/oidc/code", {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json, application/problem+json" },
    body: JSON.stringify({ code: params.get("code"), code_verifier: flow.verifier, redirect_uri: redirectUri(), nonce: flow.nonce }),
  });
  const body = await res.json().catch(() => ({}));
  if (!res.ok) throw new ApiError(res.status, body.detail || `${res.status} ${res.statusText}`);
  setToken(body.secret);
  sessionStorage.setItem(SESSION_KEY, String(body.id));
  return flow.next || "/queue";
}

/** Revoke the token a sign-in issued, if this tab holds one (before the token is forgotten). */
export async function endSession() {
  const id = sessionStorage.getItem(SESSION_KEY);
  sessionStorage.removeItem(SESSION_KEY);
  if (!id) return;
  try {
    await api(`/v1/tokens/${encodeURIComponent(id)}`, { method: "DELETE" });
  } catch {
    /* already revoked or expired: nothing left to end */
  }
}
