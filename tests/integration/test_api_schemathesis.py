"""Schemathesis against the app's own OpenAPI document, as an authenticated admin, on PostgreSQL.

Every operation gets generated requests (positive and negative data): no response may be a 5xx, and every
response must conform to the documented status codes, content types and schemas. The whole run happens inside
the rolled-back ``db`` transaction. Explicit cases for the nasty inputs follow.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from httpx import Response
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tests.support.api import World, auth, build_world, make_app, spec

pytestmark = pytest.mark.integration

EXAMPLES_PER_OPERATION = 30
MIN_REQUESTS = 1000
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _fuzz(
    operation: schemathesis.APIOperation, mode: GenerationMode, headers: dict[str, str], sent: dict[str, int]
) -> None:
    @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION // 2,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS)
        sent[operation.label] = sent.get(operation.label, 0) + 1

    run()


def test_generated_requests_never_5xx_and_conform(db: Session, pg_engine: Engine, tmp_path: Path) -> None:
    app = make_app(pg_engine, tmp_path, db, rate_limit_per_minute=10**7, rate_limit_burst=10**6)
    with TestClient(app) as c:
        world = build_world(db, c)
    headers = auth(world.tokens["admin"])
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    sent: dict[str, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    # Revoking tokens last: the fuzzer may well revoke the very token it is using.
    operations.sort(key=lambda op: op.label == "DELETE /v1/tokens/{token_id}")
    for operation in operations:
        _fuzz(operation, GenerationMode.POSITIVE, headers, sent)
        with suppress(Unsatisfiable):  # nothing to negate: the operation takes no parameters and no body
            _fuzz(operation, GenerationMode.NEGATIVE, headers, sent)
    total = sum(sent.values())
    assert total >= MIN_REQUESTS, f"only {total} generated requests: {sent}"
    assert len(sent) >= 35, sorted(sent)


@pytest.fixture
def admin(client: TestClient, world: World) -> dict[str, str]:
    return world.h("admin")


def _is_problem(r: Response, *statuses: int) -> None:
    assert r.status_code in statuses, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert set(body) >= {"type", "title", "status", "detail"} and body["status"] == r.status_code
    assert "Traceback" not in r.text


@pytest.mark.parametrize(
    "text",
    [
        "name: [unclosed",
        "name: x\n  bad: indent\n: :",
        "\t- tab\n",
        "!!python/object/apply:os.system ['echo owned']",
        "a: &a [1]\nb: *a\n",
        "[" * 5000 + "]" * 5000,
        "\x00\x01",
        "",
    ],
)
def test_malformed_yaml_is_a_problem(client: TestClient, admin: dict[str, str], text: str) -> None:
    r = client.post("/v1/jobs", content=text.encode(), headers={**admin, "content-type": "application/yaml"})
    _is_problem(r, 422)


def test_non_utf8_and_deep_json(client: TestClient, admin: dict[str, str]) -> None:
    r = client.post("/v1/jobs", content=b"\xff\xfe\xfa", headers={**admin, "content-type": "application/yaml"})
    _is_problem(r, 422)
    deep = "[" * 100_000 + "]" * 100_000
    r = client.post("/v1/jobs", content=deep[:200_000], headers={**admin, "content-type": "application/json"})
    _is_problem(r, 422)


def test_oversized_bodies(client: TestClient, admin: dict[str, str]) -> None:
    big = spec(labels={f"k{i}": "v" * 128 for i in range(3000)})
    _is_problem(client.post("/v1/jobs", json=big, headers=admin), 413)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the middleware must count
        for _ in range(100):
            yield b"x" * 10_000

    r = client.post("/v1/jobs", content=chunks(), headers={**admin, "content-type": "application/yaml"})
    _is_problem(r, 413)
    _is_problem(client.post("/v1/teams", content=b"{}", headers={**admin, "content-length": "99999999"}), 413)


@pytest.mark.parametrize("name", ["équipe", "团队", "team\u200b", "🚀", "a" * 65, "UPPER", "-x"])
def test_unicode_and_bad_names(client: TestClient, admin: dict[str, str], name: str) -> None:
    _is_problem(client.post("/v1/teams", json={"name": name}, headers=admin), 422)
    _is_problem(client.post("/v1/jobs", json=spec(name=name), headers=admin), 422)
    _is_problem(client.get(f"/v1/teams/{name}", headers=admin), 404, 422)
    _is_problem(client.get("/v1/jobs", params={"name": name}, headers=admin), 422)


def test_unicode_where_free_text_is_allowed(client: TestClient, admin: dict[str, str]) -> None:
    r = client.post("/v1/jobs", json=spec(labels={"note": "résumé 🚀 训练"}), headers=admin)
    assert r.status_code == 201 and r.json()["spec"]["labels"]["note"] == "résumé 🚀 训练"
    r = client.post("/v1/tokens", json={"name": "ключ 🔑"}, headers=admin)
    assert r.status_code == 201 and r.json()["name"] == "ключ 🔑"
    _is_problem(client.post("/v1/tokens", json={"name": "nul\x00byte"}, headers=admin), 422)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/jobs", spec(resources={"gpus": -1})),
        ("POST", "/v1/jobs", spec(resources={"gpus": 10**20})),
        ("POST", "/v1/jobs", spec(steps=-5)),
        ("POST", "/v1/jobs", spec(seed=2**64)),
        ("POST", "/v1/jobs", spec(time_limit_s=1e308)),
        ("POST", "/v1/jobs", '{"name": "x", "team": "alpha", "recipe": {"name": "gpt"}, "time_limit_s": 1e999}'),
        ("POST", "/v1/teams", '{"name": "n", "fair_share_weight": NaN}'),
        ("POST", "/v1/teams", {"name": "n", "fair_share_weight": -1}),
        ("POST", "/v1/teams", {"name": "n", "quotas": [{"gpu_type": "H200", "nominal": 2**40}]}),
        ("POST", "/v1/teams", {"name": "n", "gpu_hour_budget": 1e300}),
        ("PATCH", "/v1/qos/gold", {"gpu_memory_cap_bytes": 2**70}),
        ("PATCH", "/v1/qos/gold", {"priority": -(2**40)}),
        ("PUT", "/v1/teams/alpha/sla", {"max_restarts": -1}),
        ("PUT", "/v1/teams/alpha/sla", {"deadline": "9999-12-31T23:59:59-14:00"}),
        ("POST", "/v1/tokens", {"name": "t", "expires_in_s": 10**12}),
        ("GET", "/v1/jobs/-1", None),
        ("GET", f"/v1/jobs/{2**70}", None),
        ("GET", "/v1/jobs?limit=-3", None),
        ("GET", "/v1/jobs?limit=100000000000000000000", None),
        ("GET", "/v1/jobs/1/events?after=-1", None),
        ("GET", "/v1/jobs/1/metrics?max_points=0", None),
        ("GET", "/v1/usage?since=0001-01-01T00:00:00%2B14:00", None),
    ],
)
def test_negative_and_huge_numbers(
    client: TestClient, admin: dict[str, str], method: str, path: str, body: object
) -> None:
    if isinstance(body, str):  # literals json.dumps cannot write (1e999, NaN)
        r = client.request(method, path, content=body, headers={**admin, "content-type": "application/json"})
    else:
        r = client.request(method, path, json=body, headers=admin)
    _is_problem(r, 422)
