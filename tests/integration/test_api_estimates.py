"""POST /v1/estimates on PostgreSQL: options from the hosts the cluster has, step times from finished attempts' step
telemetry (measured, scaled, or none), the cheapest option that meets the deadline, and bad input as problem+json."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import GPU, Host, Job
from tests.support.api import World, spec
from tests.support.measured_runs import record_run

pytestmark = pytest.mark.integration

GIB = 2**30
MINI = {"name": "gpt", "hyperparameters": {"size": "mini", "batch_size": 8}}


def _gpu_spec(**fields: Any) -> dict[str, Any]:
    return spec(**{"recipe": MINI, "steps": 1000, "resources": {"gpus": 1, "gpu_type": "H200"}, **fields})


def _hosts(db: Session) -> None:
    for name, model, count, memory in (("h200-a", "H200", 2, 141 * GIB), ("h100-a", "H100-80GB", 1, 80 * GIB)):
        host = Host(name=name, queue=f"q.{name}", cpu_slots=0)
        host.gpus = [GPU(uuid=f"{name}-{i}", index=i, model=model, memory_bytes=memory) for i in range(count)]
        db.add(host)
    db.flush()


def _ran(
    client: TestClient,
    world: World,
    db: Session,
    body: dict[str, Any],
    *,
    startup_s: float,
    step_s: list[float],
    gpu_type: str = "H200",
) -> Job:
    """A job of ``body`` with one finished attempt: ``startup_s`` to its first step, then steps of ``step_s``."""
    r = client.post("/v1/jobs", json=body, headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = db.get_one(Job, r.json()["id"])
    record_run(db, job.id, startup_s=startup_s, step_s=step_s, gpu_type=gpu_type)
    return job


def _estimate(client: TestClient, world: World, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/estimates", json=body, headers=world.h("member"))
    assert r.status_code == 200, r.text
    return r.json()


def _option(answer: dict[str, Any], **config: Any) -> dict[str, Any]:
    found = [o for o in answer["options"] if all(o[k] == v for k, v in config.items())]
    assert len(found) == 1, (config, [o["description"] for o in answer["options"]])
    return found[0]


def test_without_history_memory_is_predicted_and_step_time_said_unknown(
    client: TestClient, world: World, db: Session
) -> None:
    _hosts(db)
    answer = _estimate(client, world, _gpu_spec(name="new"))
    assert answer["measured_runs"] == 0
    assert answer["summary"].startswith("no measured history of this recipe yet")
    assert answer["recommended"] is None
    written = answer["options"][0]
    assert (written["gpu_type"], written["gpus"], written["parallelism"], written["compiled"]) == (
        "H200",
        1,
        "single",
        True,
    )
    assert written["changes"] == {}
    assert written["memory_basis"] == "predicted" and written["fits"] is True
    assert written["step_time"] is None and written["gpu_hours"] is None
    # every GPU type the cluster has, 1 and 2 GPUs of the H200 (the global batch of 8 kept: 4 a rank), one H100
    assert {(o["gpu_type"], o["gpus"]) for o in answer["options"]} == {("H200", 1), ("H200", 2), ("H100-80GB", 1)}
    two = _option(answer, gpu_type="H200", gpus=2, parallelism="fsdp", compiled=True)
    assert two["changes"] == {"resources.gpus": 2, "recipe.hyperparameters.batch_size": 4, "parallelism": "fsdp"}
    assert two["peak_memory_bytes"] < written["peak_memory_bytes"]  # sharded, and half the batch a rank
    assert not any(o["gpu_share"] for o in answer["options"])  # no host runs MPS
    assert any("MPS" in n for n in answer["notes"])


def test_measured_history_picks_the_cheapest_that_meets_the_deadline(
    client: TestClient, world: World, db: Session
) -> None:
    _hosts(db)
    # compiled: 30 s to its first step, then 0.10 s a step; eager: 2 s, then 0.12 s; each run's first fifth of steps
    # is warm-up, left out (1 s here); and the same global batch on 2 GPUs (4 a rank), compiled, 0.07 s a step
    _ran(client, world, db, _gpu_spec(name="compiled"), startup_s=30, step_s=[1.0] * 20 + [0.1] * 80)
    _ran(
        client,
        world,
        db,
        _gpu_spec(name="eager", compile={"mode": "off"}),
        startup_s=2,
        step_s=[1.0] * 20 + [0.12] * 70 + [0.125] * 10,
    )
    wide = {"name": "gpt", "hyperparameters": {"size": "mini", "batch_size": 4}}
    _ran(
        client,
        world,
        db,
        _gpu_spec(name="wide", recipe=wide, resources={"gpus": 2, "gpu_type": "H200"}, parallelism="ddp"),
        startup_s=30,
        step_s=[0.07] * 100,
    )
    answer = _estimate(client, world, _gpu_spec(name="next"))
    assert answer["measured_runs"] == 3
    compiled, eager = answer["options"][0], _option(answer, gpu_type="H200", gpus=1, compiled=False)
    assert compiled["step_time"]["basis"] == "measured" and compiled["step_time"]["median_s"] == pytest.approx(0.1)
    assert compiled["step_time"]["startup_s"] == pytest.approx(30)
    assert compiled["gpu_hours"] == pytest.approx((30 + 1000 * 0.1) / 3600)
    assert compiled["cost"] == pytest.approx(compiled["gpu_hours"] * 4.5)  # the H200's default price
    assert eager["step_time"]["high_s"] == pytest.approx(0.125)  # its spread: the 90th percentile
    assert eager["gpu_hours"] == pytest.approx((2 + 1000 * 0.12) / 3600)
    assert answer["options"][answer["recommended"]] == eager  # 122 s (127 s at its p90) against 130 s
    assert eager["changes"] == {"compile.mode": "off"}
    assert "6% less" in answer["summary"]
    ddp = _option(answer, gpu_type="H200", gpus=2, parallelism="ddp", compiled=True)
    assert ddp["step_time"]["basis"] == "measured" and ddp["hours"] == pytest.approx(100 / 3600)
    assert ddp["gpu_hours"] == pytest.approx(200 / 3600)
    # No run on the H100: the H200's, scaled by the two types' published peaks, labelled, and never preferred
    h100 = _option(answer, gpu_type="H100-80GB", gpus=1, compiled=True)["step_time"]
    assert (h100["basis"], h100["scaled_from"], h100["label"]) == ("cross-type", "H200", "scaled from H200")
    assert h100["low_s"] <= 0.1 < h100["median_s"] < h100["high_s"] <= 0.1 * 4800 / 3350 + 1e-9  # 4.8 vs 3.35 TB/s

    # A deadline 110 s away: only the 2-GPU run (100 s) ends before it, at more GPU-hours
    soon = (utcnow() + timedelta(seconds=110)).isoformat()
    answer = _estimate(client, world, _gpu_spec(name="next", sla={"deadline": soon}))
    best = answer["options"][answer["recommended"]]
    assert best["changes"] == {"resources.gpus": 2, "recipe.hyperparameters.batch_size": 4}  # auto: DDP there
    assert best["meets_deadline"] is True and answer["options"][0]["meets_deadline"] is False
    assert any("queue" in n for n in answer["notes"])


def test_a_shape_never_run_is_scaled_from_one_that_was(client: TestClient, world: World, db: Session) -> None:
    _hosts(db)
    _ran(client, world, db, _gpu_spec(name="measured"), startup_s=10, step_s=[0.2] * 50)
    doubled = _gpu_spec(name="bigger", recipe={"name": "gpt", "hyperparameters": {"size": "mini", "batch_size": 16}})
    answer = _estimate(client, world, doubled)
    step = answer["options"][0]["step_time"]
    assert step["basis"] == "scaled" and "not measured" in step["detail"]
    assert step["median_s"] == pytest.approx(0.4)  # twice the tokens a rank, twice the FLOPs
    # the same shape on 2 GPUs (8 a rank) is the measured 1-GPU shape's work per rank: scaled x1
    two = _option(answer, gpu_type="H200", gpus=2, parallelism="ddp", compiled=True)
    assert two["step_time"]["median_s"] == pytest.approx(0.2)
    assert two["gpu_hours"] == pytest.approx(2 * (10 + 1000 * 0.2) / 3600)


def test_bad_input_is_problem_json(client: TestClient, world: World) -> None:
    r = client.post("/v1/estimates", json=_gpu_spec(name="x", steps=0), headers=world.h("member"))
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == "steps"
    bad = {**MINI, "hyperparameters": {"size": "mini", "batch_sise": 8}}
    r = client.post("/v1/estimates", json=_gpu_spec(name="x", recipe=bad), headers=world.h("member"))
    assert r.status_code == 422 and "did you mean 'batch_size'" in r.text
    r = client.post("/v1/estimates", json=_gpu_spec(name="x", team="gamma"), headers=world.h("member"))
    assert r.status_code == 404
    r = client.post("/v1/estimates", json=_gpu_spec(name="x"))
    assert r.status_code == 401


def test_yaml_body_and_nothing_created(client: TestClient, world: World, db: Session) -> None:
    before = db.query(Job).count()
    text = "name: y\nteam: alpha\nrecipe: {name: gpt}\nresources: {gpus: 0, cpu_slots: 1}\nsteps: 5\n"
    r = client.post("/v1/estimates", content=text, headers={**world.h("viewer"), "Content-Type": "application/yaml"})
    assert r.status_code == 200, r.text
    options = r.json()["options"]
    assert options[0]["gpu_type"] == "cpu" and options[0]["peak_memory_bytes"] is None
    assert db.query(Job).count() == before


def _submitted(client: TestClient, world: World, db: Session, body: dict[str, Any]) -> tuple[Job, dict[str, Any]]:
    r = client.post("/v1/jobs", json=body, headers=world.h("member"))
    assert r.status_code == 201, r.text
    job = db.get(Job, r.json()["id"])
    assert job is not None
    event = client.get(f"/v1/jobs/{job.id}/events", headers=world.h("member")).json()["items"][0]
    assert event["type"] == "SUBMITTED"
    return job, event


def test_checkpointing_every_auto_is_young_daly_within_the_contract(
    client: TestClient, world: World, db: Session
) -> None:
    from core.checkpoint_interval import daly_interval_s
    from core.recipes.gpt import GPTHyperparameters
    from core.services.checkpoint_advice import PRIOR_MTBF_H

    _hosts(db)
    params = GPTHyperparameters(size="mini").shape().param_count()
    advised = daly_interval_s(params * 12 / 1e9, PRIOR_MTBF_H * 3600)  # no failure seen: the prior's MTBF
    assert 600 < advised < 3600
    job, event = _submitted(
        client, world, db, _gpu_spec(name="auto", checkpointing={"every": "auto"}, sla={"checkpoint_interval_s": 3600})
    )
    assert job.spec["checkpointing"]["every_seconds"] == round(advised)
    assert job.spec["checkpointing"]["every_steps"] is None and job.spec["checkpointing"]["every"] is None
    assert f"checkpoint every {round(advised)} s (Young/Daly" in event["message"]
    assert "prior of 1 in 6000" in event["data"]["auto"]["checkpointing.every"]["why"]

    job, event = _submitted(client, world, db, _gpu_spec(name="held", checkpointing={"every": "auto"}))
    assert job.spec["checkpointing"]["every_seconds"] == 600  # the default contract's checkpoint interval
    assert "held to the contract's checkpoint interval of 600 s" in event["message"]

    both = _gpu_spec(name="both", checkpointing={"every": "auto", "every_steps": 50})
    r = client.post("/v1/jobs", json=both, headers=world.h("member"))
    assert r.status_code == 422 and "every: auto chooses the interval" in r.text


def test_compile_auto_written_out_takes_the_cheapest_measured(client: TestClient, world: World, db: Session) -> None:
    _hosts(db)
    job, event = _submitted(client, world, db, _gpu_spec(name="unmeasured", compile={"mode": "auto"}))
    assert job.spec["compile"]["mode"] == "auto" and "auto left to the trainer" in event["message"]

    _ran(client, world, db, _gpu_spec(name="compiled"), startup_s=30, step_s=[0.1] * 50)
    _ran(client, world, db, _gpu_spec(name="eager", compile={"mode": "off"}), startup_s=2, step_s=[0.12] * 50)
    job, event = _submitted(client, world, db, _gpu_spec(name="chosen", compile={"mode": "auto"}))
    assert job.spec["compile"]["mode"] == "off"
    assert event["data"]["auto"]["compile.mode"]["chose"] == "off"
    assert (
        "auto chose 1 x H200, eager, bf16: the cheapest measured at 0.0339 GPU-h (1 x H200, compiled, bf16: "
        "0.0361 GPU-h)"
    ) in event["message"]
    eager_peak = job.predicted_memory_bytes
    job, event = _submitted(client, world, db, _gpu_spec(name="default"))  # auto by default: left to the trainer
    assert job.spec["compile"]["mode"] == "auto" and "auto" not in event["data"]
    assert eager_peak is not None and job.predicted_memory_bytes is not None
    assert eager_peak > job.predicted_memory_bytes  # the eager layout's own prediction: more activations kept


def test_fewer_gpus_than_a_hosts_share_drop_it_and_other_recipes_runs_say_nothing(
    client: TestClient, world: World, db: Session
) -> None:
    _ran(
        client,
        world,
        db,
        spec(name="cpu-run", recipe=MINI, resources={"gpus": 0, "cpu_slots": 1}),
        startup_s=1,
        step_s=[0.3] * 20,
        gpu_type="cpu",
    )
    _hosts(db)  # after: a cluster of GPU hosts only refuses a CPU job
    answer = _estimate(client, world, _gpu_spec(name="gang", resources={"gpus": 2, "gpus_per_node": 2}))
    one = _option(answer, gpu_type="H200", gpus=1, compiled=True)
    assert one["changes"]["resources.gpus_per_node"] is None
    assert answer["measured_runs"] == 1  # a CPU run of the recipe: nothing to say of a GPU's step time
    assert answer["summary"].startswith("no measured run of this recipe matches these options")


def test_a_scripts_history_is_its_teams_runs_of_the_same_command(client: TestClient, world: World, db: Session) -> None:
    script = spec(
        name="script", recipe=None, command=["python", "train.py"], code={}, resources={"gpus": 0, "cpu_slots": 1}
    )
    job = _ran(client, world, db, spec(name="recipe-run"), startup_s=2, step_s=[0.2] * 20, gpu_type="cpu")
    job.spec = {**job.spec, "recipe": None, "command": ["python", "train.py"], "code": {"digest": "0" * 64}}
    db.flush()  # what a script job's stored spec says (its upload is not needed here)
    answer = _estimate(client, world, script)
    assert answer["options"][0]["step_time"]["median_s"] == pytest.approx(0.2)
    other = _estimate(client, world, {**script, "command": ["python", "other.py"]})
    assert other["options"][0]["step_time"] is None
    r = client.post("/v1/estimates", json={**script, "team": "beta"}, headers=world.h("beta-member"))
    assert r.status_code == 200 and r.json()["options"][0]["step_time"] is None  # alpha's runs are alpha's


def test_a_gpu_share_is_an_option_where_a_host_runs_mps(client: TestClient, world: World, db: Session) -> None:
    _hosts(db)
    host = db.query(Host).filter_by(name="h200-a").one()
    host.mps = "running"
    db.flush()
    tiny_share = {"gpus": 1, "gpu_type": "H200", "gpu_share": {"memory_gb": 0.01}}
    answer = _estimate(client, world, _gpu_spec(name="shared", resources=tiny_share))
    written = answer["options"][0]
    assert written["gpu_share"] is True and written["description"] == "a share of 1 x H200, compiled, bf16"
    assert written["gpu_memory_bytes"] == int(0.01 * GIB) and written["fits"] is False  # the mini GPT needs more
    whole = _option(answer, gpu_type="H200", gpus=1, gpu_share=False, compiled=True)
    assert whole["changes"] == {"resources.gpu_share": None} and whole["fits"] is True
    assert not any(o["gpu_share"] for o in answer["options"] if o["gpu_type"] == "H100-80GB")  # no MPS there


def test_what_no_option_can_mend_is_refused_as_at_submit(client: TestClient, world: World, db: Session) -> None:
    _hosts(db)
    r = client.post(
        "/v1/estimates", json=_gpu_spec(name="x", resources={"gpus": 1, "gpu_type": "H20O"}), headers=world.h("member")
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "resources.gpu_type"
    assert "did you mean 'H200'?" in r.text
    r = client.post("/v1/estimates", json=_gpu_spec(name="x", sla={"qos": "platinum"}), headers=world.h("member"))
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == "sla.qos"
