"""A request body is read within bounds: a YAML or JSON document nested too deeply, or a YAML document of too many
nodes, is refused (422, problem+json) while it is read, in well under half a second of CPU, whatever it holds.

Before: PyYAML's pure-Python reader took 1-3 s of the API's CPU on a deeply nested flow collection (``[[[[...``)
or a long flat one before its 422, and 14 s on a 10 KB one holding an alias mark (the alias check parsed the whole
document first, at a cost growing with the square of its depth); a sweep sent as JSON 900 levels deep crashed the
request (RecursionError while its jobs were expanded: 500). Now YAML bodies are read by libyaml's parser with a
composer that counts depth and nodes as it goes (and refuses an alias as soon as it meets one), and every JSON
body's depth is measured from its bytes before anything parses it."""

from __future__ import annotations

import json
import time

import pytest
from fastapi.testclient import TestClient

from tests.support.api import World, spec

pytestmark = pytest.mark.integration

# CPU seconds this process spends on one refused request (the API runs in the test client's thread, so the
# process's CPU time is the request's): the attacker's cost to kiln. Wall time is not measured: on the CI box's
# two loaded test processes a 0.03 s refusal once took 0.51 s of wall time.
BUDGET_S = 0.5
YAML = "application/yaml"
JSON = "application/json"
SWEEP = {"list": [{"lr": 0.1}, {"lr": 0.2}]}


def _deep_json(levels: int, **extra: object) -> bytes:
    """A spec whose hyperparameter ``x`` is a list nested ``levels`` deep (built as text: no recursion here)."""
    doc = json.dumps({**spec(recipe={"name": "gpt", "hyperparameters": {"x": "@"}}), **extra})
    return doc.replace('"@"', "[" * levels + "]" * levels).encode()


BODIES: dict[str, tuple[str, bytes]] = {
    # ~120 KiB of flow sequences (the review's body).
    "yaml-flow-deep": (YAML, ("name: x\nrecipe: " + "[" * 120_000).encode()),
    # 10 KiB, with an alias mark at its end: the old alias check read it all first.
    "yaml-flow-deep-alias": (YAML, ("name: x\nrecipe: " + "[" * 10_000 + "*a").encode()),
    # block mappings, each indented one more space (~250 KiB): 700 levels
    "yaml-block-deep": (YAML, "".join(" " * i + "k:\n" for i in range(700)).encode()),
    # a flat flow sequence of 120,000 numbers (~240 KiB): no depth, only size
    "yaml-flat-long": (YAML, ("name: x\nsteps: [" + "1," * 120_000 + "1]").encode()),
    # 900 levels of JSON arrays (~1.8 KB); the JSON parser's own limit is about 1,000
    "json-deep": (JSON, _deep_json(900)),
    # the same with the brackets inside strings too, which count for nothing
    "json-deep-strings": (JSON, _deep_json(900, description='"[[[[\\"' * 100 + '\\\\"')),
}


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/sweeps"])
@pytest.mark.parametrize("case", list(BODIES))
def test_a_body_nested_or_sized_past_the_bounds_is_refused_quickly(
    client: TestClient, world: World, case: str, path: str
) -> None:
    ctype, body = BODIES[case]
    if path == "/v1/sweeps" and ctype == JSON:  # a sweep document: the spec and its sweep section
        body = body[:-1] + b', "sweep": ' + json.dumps(SWEEP).encode() + b"}"
    started = time.process_time()
    r = client.post(path, content=body, headers={**world.h("member"), "Content-Type": ctype})
    took = time.process_time() - started
    assert r.status_code == 422, r.text[:500]
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["type"] in ("depth", "size", "alias"), r.json()
    assert took < BUDGET_S, f"{case} on {path}: {took:.2f} s"


def test_a_sweep_multiplying_a_large_spec_is_refused_before_it_is_expanded(client: TestClient, world: World) -> None:
    """120 KB of hyperparameters (a team's own recipe: kiln does not know its fields) over 256 grid points: 30 MB of
    specs to copy and validate. Before: 2.9 s of CPU here, before the 422 of its first check (no such code)."""
    doc = {
        **spec(name="amp", code={"digest": "0" * 64, "entry_point": "mine"}),
        "recipe": {"name": "mine", "hyperparameters": {"x": [1] * 60_000}},
        "sweep": {"grid": {"lr": [i / 1000 for i in range(256)]}},
    }
    started = time.process_time()
    r = client.post("/v1/sweeps", json=doc, headers=world.h("member"))
    assert r.status_code == 422 and r.json()["errors"][0]["type"] == "size", r.text[:300]
    assert "256 jobs" in r.json()["detail"]
    assert time.process_time() - started < BUDGET_S


@pytest.mark.parametrize("path", ["/v1/tokens", "/v1/webhooks", "/v1/teams/alpha/datasets"])
def test_every_json_body_is_bounded(client: TestClient, world: World, path: str) -> None:
    body = b'{"name": "x", "description": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    started = time.process_time()
    r = client.post(path, content=body, headers={**world.h("team-admin"), "Content-Type": JSON})
    assert r.status_code == 422 and r.json()["errors"][0]["type"] == "depth", r.text[:300]
    assert time.process_time() - started < BUDGET_S


def test_documents_within_the_bounds_are_read_as_before(client: TestClient, world: World) -> None:
    doc = spec(name="nested", sla={"qos": "silver"})
    yaml_doc = json.dumps({**doc, "sweep": {**SWEEP, "objective": {"metric": "loss", "goal": "minimize"}}})
    r = client.post("/v1/sweeps", content=yaml_doc, headers={**world.h("member"), "Content-Type": YAML})
    assert r.status_code == 201, r.text  # JSON is YAML
    # Brackets inside strings are text, not nesting, whatever their number (32 labels of 128 "[" each).
    labels = {f"l{i}": "[" * 127 + '"' for i in range(32)}
    r = client.post("/v1/jobs", json={**doc, "name": "brackets", "labels": labels}, headers=world.h("member"))
    assert r.status_code == 201, r.text[:300]
    r = client.post(
        "/v1/jobs",
        content=json.dumps({**doc, "name": "brackets-yaml", "labels": labels}),
        headers={**world.h("member"), "Content-Type": YAML},
    )
    assert r.status_code == 201, r.text[:300]
    # Nine levels are nothing to refuse: the token's own rules answer.
    deep_ok = json.dumps({"name": "x", "description": {"a": {"b": {"c": {"d": [[[[1]]]]}}}}})
    r = client.post("/v1/tokens", content=deep_ok, headers={**world.h("member"), "Content-Type": JSON})
    assert r.status_code == 422 and r.json()["errors"][0]["type"] != "depth"
