// A real, certified OpenID provider (panva's oidc-provider) for kiln's sign-in tests: the dashboard's client
// (authorization code + PKCE, confidential), the CLI's (device authorization grant, public). Accounts and their
// groups are read from the JSON file ACCOUNTS names at every sign-in, so a test can take a group away.
// Usage: node provider.js  (env: PORT, REDIRECT_URI, ACCOUNTS); prints "ready <issuer>" when up.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;

const accounts = () => JSON.parse(readFileSync(process.env.ACCOUNTS, "utf8"));

function account(id) {
  const who = accounts()[id];
  if (!who) return undefined; // the dev login page then says the login failed
  return {
    accountId: id,
    async claims() {
      return { sub: id, preferred_username: id, email: `${id}@example.test`, groups: who.groups };
    },
  };
}

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: "kiln-dashboard",
      client_secret: "dashboard-secret",
      redirect_uris: [process.env.REDIRECT_URI],
      grant_types: ["authorization_code"],
      response_types: ["code"],
    },
    {
      client_id: "kiln-cli",
      token_endpoint_auth_method: "none",
      grant_types: ["urn:ietf:params:oauth:grant-type:device_code"],
      response_types: [],
      redirect_uris: [],
    },
  ],
  claims: { openid: ["sub"], profile: ["preferred_username"], email: ["email"], groups: ["groups"] },
  scopes: ["openid", "profile", "email", "groups"],
  // The groups belong in the ID token itself: kiln reads no userinfo.
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: true }, deviceFlow: { enabled: true } },
  pkce: { required: () => true },
  // An account may carry its own ID token lifetime ("id_token_ttl_s"), so a test can have an expired one signed
  // by the provider itself.
  ttl: { IdToken: (ctx) => accounts()[ctx.oidc.entities.Account?.accountId]?.id_token_ttl_s ?? 3600 },
  cookies: { keys: ["kiln-test-cookie-key"] },
  findAccount: (ctx, id) => account(id),
  // Consent is the provider's own business: granted at once, so the tests see the login page only.
  async loadExistingGrant(ctx) {
    const { Grant } = ctx.oidc.provider;
    const grantId = ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return Grant.find(grantId);
    const grant = new Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope("openid profile email groups");
    await grant.save();
    return grant;
  },
});
provider.listen(port, "127.0.0.1", () => console.log(`ready ${issuer}`));
