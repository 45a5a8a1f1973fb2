// Swagger UI over the API's own OpenAPI document. A script file, not an inline one, so the page keeps the strict
// Content-Security-Policy every kiln page has (script-src 'self'); no validator or other outside service is asked.
// eslint-disable-next-line no-undef
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
