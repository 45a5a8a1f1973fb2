"""The published OpenAPI document, as other tools read it: generators (openapi-python-client, openapi-typescript),
validators (openapi-spec-validator) and Swagger UI.

FastAPI's generated document is completed here: the ``JobSpec`` that ``POST /v1/jobs`` reads by hand (JSON or
YAML), one ``Problem`` component that every error response of every operation refers to, the bearer scheme each
authenticated operation declares, and a description per tag. Operation ids are the handlers' names in camelCase
(``submit_job`` -> ``submitJob``), so a generated client reads as the API does.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute

from api.routers.common import ERROR_CODES
from api.schemas.common import PROBLEM_REF, Problem
from api.schemas.jobs import JOB_EXAMPLE
from core.spec import JobSpec

# The middlewares and handlers can answer ERROR_CODES on any /v1 route (auth, body limit, media type, rate limit,
# database down); elsewhere (health, dashboard assets) only the three that need no route of their own.
OTHER_ERROR_CODES = (413, 500, 503)

# Routes anyone may call: no token. Every other operation requires ``Authorization: Bearer kiln_...``.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/v1/auth/oidc", "/v1/auth/oidc/code", "/v1/auth/oidc/id-token"})

SPEC_EXAMPLE: dict[str, Any] = {
    "name": "gpt-tiny",
    "team": "default",
    "recipe": {"name": "gpt", "hyperparameters": {"size": "tiny", "corpus": "stdlib", "lr": 0.003}},
    "steps": 60,
    "resources": {"gpus": 0, "cpu_slots": 1},
    "parallelism": "ddp",
    "precision": "fp32",
    "sla": {"qos": "silver", "max_queue_wait_s": 600},
}

TAGS: list[dict[str, str]] = [
    {"name": "jobs", "description": "Submit, list, follow and cancel training jobs."},
    {"name": "estimates", "description": "A job's memory, step time, GPU-hours and cost per option, before it runs."},
    {"name": "sweeps", "description": "Sweeps: one submission expanded over a grid or list of settings."},
    {"name": "exports", "description": "A checkpoint's weights exported as safetensors, with a manifest."},
    {"name": "artifacts", "description": "A team's code archives, content-addressed by SHA-256 (docs/user-code.md)."},
    {
        "name": "datasets",
        "description": "A team's registered datasets: names for read-only data directories of "
        "kiln's storage (docs/user-code.md).",
    },
    {"name": "webhooks", "description": "Signed notifications of a team's or a job's events, and their delivery log."},
    {"name": "sla", "description": "SLA contracts: a team's default and a job's effective terms."},
    {"name": "teams", "description": "Teams, their quotas, members and invitations."},
    {"name": "users", "description": "Users, the caller (`/v1/me`) and the caller's invitations."},
    {"name": "tokens", "description": "API tokens: issue, list, revoke."},
    {"name": "sign-in", "description": "Sign-in with an OpenID provider: a kiln token for the dashboard or the CLI."},
    {"name": "streams", "description": "Single-purpose tickets for Server-Sent Event streams."},
    {"name": "qos", "description": "QoS classes: priority, preemption, default queue-wait objectives."},
    {"name": "cluster", "description": "Hosts and GPUs the workers registered."},
    {"name": "usage", "description": "GPU-hours per team and GPU type."},
    {"name": "dashboard", "description": "Read-only views the web dashboard draws."},
    {"name": "health", "description": "Liveness, readiness and Prometheus metrics."},
]

# Relative: the document describes the API of whichever origin serves it (kiln up's, a deployment's), and Swagger
# UI's "Try it out" calls that origin.
SERVERS: list[dict[str, str]] = [{"url": "/", "description": "the origin that serves this document"}]
# The repository grants no licence (it has no LICENSE file): say so rather than leave generators guessing.
LICENSE: dict[str, str] = {"name": "Proprietary: no licence is granted", "identifier": "LicenseRef-Proprietary"}

BEARER_SCHEME: dict[str, Any] = {
    "type": "http",
    "scheme": "bearer",
    "description": "An API token (`kiln_...`): `kiln tokens create`, or the one `kiln up` prints.",
}


def operation_id(route: APIRoute) -> str:
    """``submit_job`` -> ``submitJob``; the dashboard's views carry their tag (``queue`` -> ``dashboardQueue``)."""
    name = route.name
    if "dashboard" in (route.tags or []) and not name.startswith("dashboard"):
        name = f"dashboard_{name}"
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def document(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document (built once per app)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=TAGS,
        servers=SERVERS,
        license_info=LICENSE,
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    _add_model(schemas, "JobSpec", JobSpec.model_json_schema(ref_template="#/components/schemas/{model}"))
    schemas["JobSpec"]["examples"] = [SPEC_EXAMPLE]
    # A job's spec is served as stored (api.schemas.jobs.StoredSpec): the JobSpec it was validated as.
    schemas["JobOut"]["properties"]["spec"] = {"$ref": "#/components/schemas/JobSpec"}
    # FastAPI drops every None from the document, the nulls of this example included: put it back whole.
    schemas["JobOut"]["examples"] = [JOB_EXAMPLE]
    # The job's detail (GET /v1/jobs/{id}) is a JobOut with its spec and example the same, and its checkpoint advice.
    schemas["JobDetailOut"]["properties"]["spec"] = {"$ref": "#/components/schemas/JobSpec"}
    schemas["JobDetailOut"]["examples"] = [{**JOB_EXAMPLE, "checkpoint_advice": None}]
    _add_model(schemas, "Problem", Problem.model_json_schema(ref_template="#/components/schemas/{model}"))
    doc["components"]["securitySchemes"] = {"bearer": BEARER_SCHEME}
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            _complete(path, operation)
    # FastAPI's own 422 body, replaced by Problem on every operation above.
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    app.openapi_schema = doc
    return doc


def _add_model(schemas: dict[str, Any], name: str, schema: dict[str, Any]) -> None:
    """A model and the models it refers to, as components (pydantic puts the latter under ``$defs``)."""
    schemas.update(schema.pop("$defs", {}))
    schemas[name] = schema


def _complete(path: str, operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    codes = ERROR_CODES if path.startswith("/v1/") else OTHER_ERROR_CODES
    problem = {"application/problem+json": {"schema": PROBLEM_REF}}
    for code in codes:
        responses.setdefault(str(code), {})
    for code, response in responses.items():
        if code.isdigit() and int(code) >= 400:
            response["content"] = problem
            if not response.get("description"):
                response["description"] = HTTPStatus(int(code)).phrase
    # Declared either way: a public route's empty list says "no token" rather than leaving readers to assume one.
    operation["security"] = [] if path in PUBLIC_PATHS else [{"bearer": []}]
