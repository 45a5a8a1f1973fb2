"""The team compile cache through the trainer, on the CPU (Inductor's C++ backend).

A second job of the team (another learning rate, another job id) on another host (its own process and job
directory; only the team's cache directory shared) hits the team's entry and trains as its eager twin. Entries
that fail a check (bytes changed after publish, an ``entry.json`` of another key, artifacts that load but compute
another loss than eager) are rejected with ``COMPILE_CACHE_REJECTED``, discarded, and the job compiles afresh and
trains as eager does. The rejections run in this process with kiln's ``Compiler`` on a two-layer block: one cold
compile, the others warm from Inductor's in-process C++ cache, so the suite pays one compile for them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from harness.deps import require_module
from tests.support.compiler_env import compiler_cache_env_restored  # noqa: F401  (autouse)

torch = require_module("torch")

from torch import nn  # noqa: E402

from core import compile_cache as store  # noqa: E402
from tests.e2e.test_trainer_e2e import ROOT, env, events, losses, make_spec, records  # noqa: E402

pytestmark = pytest.mark.e2e
COMPILE_RTOL = 1e-3  # compiled vs eager losses (fp32 on CPU; Inductor reorders reductions)


def run_job(spec: pathlib.Path, run_dir: pathlib.Path, host: pathlib.Path, team: pathlib.Path, job_id: int) -> None:
    """One job as a worker on ``host`` runs it: its own compile dir there, the team's cache shared."""
    extra = {
        "KILN_COMPILE_CACHE_DIR": str(host / "compile_cache" / str(job_id)),
        "KILN_TEAM_COMPILE_CACHE_DIR": str(team),
        "KILN_JOB_ID": str(job_id),
        "KILN_ATTEMPT_ID": str(job_id * 10),
    }
    cmd = [sys.executable, "-m", "rank.entry", "--spec", str(spec), "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=ROOT, env=env(**extra), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.timeout(400)
def test_a_second_job_on_another_host_hits_the_team_cache(tmp_path: pathlib.Path) -> None:
    team = tmp_path / "storage" / "compile_cache" / "teams" / "3"
    small = {"steps": 4, "every": None, "n_layer": 1, "batch_size": 4, "seq_len": 64}
    a = make_spec(tmp_path, "a", compile_mode="regional", lr=0.003, **small)
    b = make_spec(tmp_path, "b", compile_mode="regional", lr=0.001, **small)
    twin = make_spec(tmp_path, "twin", compile_mode="off", lr=0.001, **small)
    run_job(a, tmp_path / "a", tmp_path / "host1", team, 1)
    run_job(b, tmp_path / "b", tmp_path / "host2", team, 2)
    run_job(twin, tmp_path / "twin", tmp_path / "host2", team, 3)

    first, published = (
        events(records(tmp_path / "a"), "COMPILE_OK")[0],
        events(records(tmp_path / "a"), "COMPILE_CACHE_PUBLISHED"),
    )
    assert first["fields"]["cache_hit"] is False and first["fields"]["saved_s"] is None
    key = first["fields"]["cache_key"]
    assert published and published[0]["fields"]["cache_key"] == key
    entry = json.loads((team / key / store.ENTRY).read_text())
    assert (entry["job_id"], entry["attempt"]) == ("1", "10") and entry["cold_compile_s"] > 0
    hit = events(records(tmp_path / "b"), "COMPILE_OK")[0]["fields"]
    assert (hit["cache_hit"], hit["cache_source"], hit["cache_key"]) == (True, "team", key)
    assert hit["saved_s"] == pytest.approx(entry["cold_compile_s"] - hit["elapsed_s"], abs=1e-3)
    assert hit["phases"]["counters"].get("inductor.fxgraph_cache_hit", 0) >= 1  # Inductor answered from the entry
    assert "inductor.fxgraph_cache_miss" not in hit["phases"]["counters"]
    assert not events(records(tmp_path / "b"), "COMPILE_CACHE_PUBLISHED")
    got, want = losses(records(tmp_path / "b")), losses(records(tmp_path / "twin"))
    assert sorted(got) == [1, 2, 3, 4]
    for step, loss in got.items():
        assert loss == pytest.approx(want[step], rel=COMPILE_RTOL), step


# ---- rejected entries, in this process -----------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


@dataclasses.dataclass
class Job:
    report: Any
    events: list[dict[str, Any]]
    losses: list[float]


def compile_and_train(base: pathlib.Path, host: str, team: pathlib.Path, *, compiled: bool = True) -> Job:
    """A job on ``host`` (its own compile dir): kiln's Compiler on a fresh model, then three SGD steps."""
    from core.telemetry import Telemetry
    from trainer.builders import persist_compiler_caches
    from trainer.cache_tiers import Tiers
    from trainer.compile import Compiler
    from trainer.config import TestHooks

    cache = base / host / "compile_cache" / "1"
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        os.environ.pop(var, None)
    persist_compiler_caches(cache)
    torch._dynamo.reset()  # a new process, as far as Dynamo knows
    torch.manual_seed(0)
    model, x = Block(), torch.randn(4, 8)
    tel = Telemetry(base / host / "run", 0)
    compiler = Compiler(
        mode="regional" if compiled else "off",
        timeout_s=300.0,
        max_rss_bytes=None,
        check_allclose=True,
        cuda_graphs=False,
        hooks=TestHooks(),
        telemetry=tel,
        device=torch.device("cpu"),
        model_name="block",
        cache_dir=cache,
        rank=0,
        world_size=1,
        group=None,
        tiers=Tiers(team=team, shared=None),
    )
    report = compiler.compile(
        model,
        [model],
        loss_fn=lambda: model(x).square().mean(),
        precision="fp32",
        model_config={"block": 1},
        rtol=1e-4,
        atol=1e-5,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trained = []
    for _ in range(3):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        trained.append(float(loss.detach()))
    tel.close()
    recs = [json.loads(line) for line in (base / host / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()]
    return Job(report, [r for r in recs if r["kind"] == "event"], trained)


def of(job: Job, type_: str) -> list[dict[str, Any]]:
    return [e["fields"] for e in job.events if e["type"] == type_]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, Job, Job]]:
    """A team whose first job compiled cold and published, and the same model trained eagerly."""
    base = tmp_path_factory.mktemp("cache")
    before = {var: os.environ.get(var) for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    cold = compile_and_train(base, "cold", base / "team")
    eager = compile_and_train(base, "eager", base / "unused", compiled=False)
    yield base, cold, eager
    for var, value in before.items():
        os.environ.pop(var, None) if value is None else os.environ.__setitem__(var, value)


def poison_numerics(blob: bytes, *, breaks: bool = False) -> bytes:
    """The entry's artifacts with the forward graph's output scaled by 1.5: artifacts that load and run, under the
    right key, and compute the wrong thing (as a miscompile or a deliberate edit would). ``breaks``: the forward
    raises instead (artifacts that load and fail to run, as kernels built for another device or driver would)."""
    from torch.compiler._cache import AppendingByteSerializer, CacheArtifactManager, _serialize_single_cache

    artifacts = CacheArtifactManager.deserialize(blob)
    assert artifacts is not None
    edited = 0
    for i, artifact in enumerate(artifacts["inductor"]):
        graph = pickle.loads(artifact.content)
        if "_forward" in graph.source_code.splitlines()[0]:
            pattern = r"\n(\s+)return \((buf\d+), "
            edit = (
                r"\n\1raise RuntimeError('a broken kernel')\n\1return (\2, "
                if breaks
                else r"\n\1\2.mul_(1.5)\n\1return (\2, "
            )
            graph.source_code, n = re.subn(pattern, edit, graph.source_code, count=1)
            edited += n
            artifacts["inductor"][i] = dataclasses.replace(artifact, content=pickle.dumps(graph))
    assert edited == 1
    serializer = AppendingByteSerializer(serialize_fn=_serialize_single_cache)
    serializer.extend(artifacts.items())
    return serializer.to_bytes()


def replace_entry(team: pathlib.Path, key: str, blob: bytes, *, honest_digest: bool) -> None:
    entry, _ = store.read(team, key) or pytest.fail("no entry")
    store.discard(team, key)
    digest = hashlib.sha256(blob).hexdigest() if honest_digest else entry.sha256
    assert store.publish(team, dataclasses.replace(entry, sha256=digest, size_bytes=len(blob)), blob)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("poison", ["bytes", "key", "numerics", "broken"])
def test_a_poisoned_entry_is_rejected_and_the_job_compiles_afresh(
    published: tuple[pathlib.Path, Job, Job], poison: str
) -> None:
    base, cold, eager = published
    team, key = base / "team", cold.report.cache_key
    honest = store.read(team, key)
    assert honest is not None and of(cold, "COMPILE_CACHE_PUBLISHED")
    if poison == "bytes":  # changed after publish: the digest no longer matches
        replace_entry(team, key, honest[1][:-64] + bytes(64), honest_digest=False)
    elif poison == "key":  # a cache built for another key, under this one
        other = store.key_of({"graph": "another model"})
        replace_entry(team, key, honest[1], honest_digest=True)
        (team / key / store.ENTRY).write_text((team / key / store.ENTRY).read_text().replace(key, other))
    elif poison == "numerics":  # right key, right digest, wrong code
        replace_entry(team, key, poison_numerics(honest[1]), honest_digest=True)
    else:  # right key, right digest, code that fails to run: rejected and compiled afresh, not trained eager
        replace_entry(team, key, poison_numerics(honest[1], breaks=True), honest_digest=True)

    job = compile_and_train(base, f"after-{poison}", team)
    rejected = of(job, "COMPILE_CACHE_REJECTED")
    check = {"bytes": "digest", "key": "key", "numerics": "numeric", "broken": "run"}[poison]
    assert [(r["check"], r["cache_key"], r["discarded"]) for r in rejected] == [(check, key, True)], rejected
    ok = of(job, "COMPILE_OK")[0]
    assert (ok["cache_hit"], ok["cache_source"], ok["saved_s"]) == (False, None, None)
    assert job.report.active and job.report.compiled_loss == pytest.approx(job.report.eager_loss, rel=1e-5)
    assert job.losses == pytest.approx(eager.losses, rel=COMPILE_RTOL)  # trains as eager does
    fresh = store.read(team, key)  # the poisoned entry is gone; the fresh compile published its own
    assert fresh is not None and of(job, "COMPILE_CACHE_PUBLISHED")[0]["sha256"] == fresh[0].sha256
    again = compile_and_train(base, f"next-{poison}", team)  # the team's next job hits the fresh entry
    assert again.report.cache_source == "team" and not of(again, "COMPILE_CACHE_REJECTED")
    assert again.losses == pytest.approx(eager.losses, rel=COMPILE_RTOL)


class NanGradBlock(Block):
    """A finite loss whose gradients are NaN (d sqrt(x) at 0 times 0): what a wrong GEMM in a backward makes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + torch.sqrt(self.a.bias.sum() * 0.0)


@pytest.mark.timeout(300)
def test_compiled_gemms_moved_to_triton_must_give_finite_gradients_or_the_compile_falls_back(
    tmp_path: pathlib.Path,
) -> None:
    """Where cuBLAS is wrong the trainer compiles the model's GEMMs with Triton (trainer.gemm_check); a GEMM left
    elsewhere would make NaN gradients, so the first backward is checked and such a compile falls back to eager
    (the trainer then trains in fp32). The choice is part of the cache key."""
    from core.telemetry import Telemetry
    from trainer.cache_tiers import Tiers
    from trainer.compile import Compiler
    from trainer.config import TestHooks

    torch._dynamo.reset()
    model, x = NanGradBlock(), torch.randn(4, 8)
    reports, tel = [], Telemetry(tmp_path / "run", 0)
    for triton_gemms in (False, True):
        compiler = Compiler(
            mode="whole",
            timeout_s=300.0,
            max_rss_bytes=None,
            check_allclose=True,
            cuda_graphs=False,
            hooks=TestHooks(),
            telemetry=tel,
            device=torch.device("cpu"),
            model_name="block",
            cache_dir=None,
            rank=0,
            world_size=1,
            group=None,
            tiers=Tiers(team=None, shared=None),
            triton_gemms=triton_gemms,
        )
        reports.append(
            compiler.compile(
                model,
                [model],
                loss_fn=lambda: model(x).square().mean(),
                precision="fp32",
                model_config={"block": 1},
                rtol=1e-4,
                atol=1e-5,
            )
        )
    tel.close()
    unchecked, checked = reports
    assert unchecked.active and unchecked.reason is None  # NaN gradients pass where no GEMM was moved
    assert not checked.active and checked.reason == "FALLBACK_NUMERIC_MISMATCH"
    assert checked.error == "non-finite gradients from the compiled backward's Triton GEMMs"
    assert checked.cache_key != unchecked.cache_key
