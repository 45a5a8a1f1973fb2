"""The published OpenAPI document as other tools read it: valid (openapi-spec-validator), one Problem component
for every error, security declared, readable operation ids, typed fields, and examples that validate."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from openapi_spec_validator import validate
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from sqlalchemy import Engine

from api.app import create_app
from api.openapi import PUBLIC_PATHS
from core.settings import Settings
from core.states import JobState
from tests.support.api import migrated_sqlite

METHODS = {"get", "post", "put", "patch", "delete"}
VALID_SPEC = {"name": "tiny", "team": "default", "recipe": {"name": "gpt"}, "resources": {"gpus": 0}}
PROBLEM_CONTENT = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
PATH_VALUES = {"team": "default", "user": "alice", "name": "silver"}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    with migrated_sqlite(tmp_path_factory.mktemp("kiln")) as eng:
        yield eng


@pytest.fixture(scope="module")
def client(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(Settings(home=tmp_path_factory.mktemp("home")), engine=engine)
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def doc(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method in METHODS:
                yield path, method, op


def test_the_document_is_valid_openapi(doc: dict[str, Any]) -> None:
    validate(doc)  # raises on the first error, e.g. "'/$defs/ProblemError' does not exist"


def test_every_error_response_is_the_one_problem_component(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    errors_items = schemas["Problem"]["properties"]["errors"]["anyOf"][0]["items"]
    assert errors_items == {"$ref": "#/components/schemas/ProblemError"}
    assert "ProblemError" in schemas and "HTTPValidationError" not in schemas
    assert '"$defs"' not in str(doc).replace("'", '"')
    for path, method, op in operations(doc):
        errors = {code: r for code, r in op["responses"].items() if int(code) >= 400}
        assert "500" in errors, (path, method)
        if path.startswith("/v1/"):
            assert {"401", "422", "429"} <= set(errors), (path, method)
        for code, response in errors.items():
            assert response["content"] == PROBLEM_CONTENT, (path, method, code)


def test_operations_declare_bearer_security_and_readable_ids(doc: dict[str, Any]) -> None:
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    ids = []
    for path, method, op in operations(doc):
        expected: list[dict[str, list[str]]] = [] if path in PUBLIC_PATHS else [{"bearer": []}]
        assert op["security"] == expected, (path, method)  # declared on every operation, [] on the public ones
        assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z0-9]*)*", op["operationId"]), op["operationId"]
        assert op["tags"] and op["tags"][0] in {t["name"] for t in doc["tags"]}, (path, method)
        ids.append(op["operationId"])
    assert len(ids) == len(set(ids))
    by_route = {(path, method): op["operationId"] for path, method, op in operations(doc)}
    assert by_route[("/v1/jobs", "post")] == "submitJob"
    assert by_route[("/v1/jobs", "get")] == "listJobs"
    assert by_route[("/v1/jobs/{job_id}", "get")] == "getJob"
    assert by_route[("/v1/jobs/{job_id}/cancel", "post")] == "cancelJob"
    assert by_route[("/v1/jobs/{job_id}/events", "get")] == "listJobEvents"


def test_the_document_names_its_servers_and_licence(doc: dict[str, Any]) -> None:
    """What a linter (Redocly's recommended rules: no-empty-servers, info-license) asks of the document."""
    assert doc["servers"] == [{"url": "/", "description": "the origin that serves this document"}]
    assert doc["info"]["license"]["name"]


def test_every_declared_authenticated_operation_refuses_a_call_without_a_token(
    client: TestClient, doc: dict[str, Any]
) -> None:
    """The security the document declares is the API's: no operation it marks as needing a token answers
    without one."""
    for path, method, op in operations(doc):
        if "security" not in op or not op["security"]:
            continue
        url = re.sub(r"\{([a-z_]+)\}", lambda m: PATH_VALUES.get(m.group(1), "1"), path)
        body = VALID_SPEC if (method, path) == ("post", "/v1/jobs") else None  # the spec is read before the token
        r = client.request(method.upper(), url, json=body)
        assert r.status_code == 401, (method, path, r.status_code, r.text)


def test_fields_are_typed(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    job = schemas["JobOut"]["properties"]
    assert job["state"] == {"$ref": "#/components/schemas/JobState"}
    assert schemas["JobState"]["enum"] == [s.value for s in JobState]
    assert job["spec"]["$ref"] == "#/components/schemas/JobSpec"
    assert schemas["EventOut"]["properties"]["data"]["properties"]["to"] == {"$ref": "#/components/schemas/JobState"}
    cancel = doc["paths"]["/v1/jobs/{job_id}/cancel"]["post"]["requestBody"]
    assert cancel.get("required", False) is False
    assert cancel["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/CancelIn"


def _validator(doc: dict[str, Any], schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    registry: Registry[Any] = Registry().with_resource("urn:doc", DRAFT202012.create_resource(doc))
    return jsonschema.Draft202012Validator(_rebase(schema), registry=registry)


def _rebase(node: Any) -> Any:
    """Point ``#/components/...`` references at the whole document (``urn:doc#/components/...``)."""
    if isinstance(node, dict):
        return {k: ("urn:doc" + v if k == "$ref" and v.startswith("#/") else _rebase(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rebase(v) for v in node]
    return node


def test_examples_validate_against_their_schemas(doc: dict[str, Any]) -> None:
    checked = 0
    for name, schema in doc["components"]["schemas"].items():
        for example in schema.get("examples", []):
            errors = list(_validator(doc, schema).iter_errors(example))
            assert not errors, (name, [e.message for e in errors])
            checked += 1
    assert checked >= 2  # JobSpec's and JobOut's at least
    assert doc["components"]["schemas"]["JobOut"]["examples"]
