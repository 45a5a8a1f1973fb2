"""Fast unit tests of the trainer's pieces (no subprocesses, tiny tensors)."""

from __future__ import annotations

import json
import pathlib

import pytest

from harness.deps import require_module
from tests.support.compiler_env import compiler_cache_env_restored  # noqa: F401  (autouse)

torch = require_module("torch")

from core import memory  # noqa: E402
from core.spec import JobSpec  # noqa: E402
from core.telemetry import Telemetry  # noqa: E402
from trainer.checkpoint import (  # noqa: E402
    Checkpointer,
    FencedError,
    list_checkpoints,
    verify,
    write_manifest_and_commit,
)
from trainer.config import ConfigError, GuardConfig, TrainerConfig  # noqa: E402
from trainer.data import TokenBatches  # noqa: E402
from trainer.guards import SpikeGuard  # noqa: E402
from trainer.precision import SCALER_INIT, PrecisionContext, resolve  # noqa: E402
from trainer.recipes import RecipeError, load_recipe  # noqa: E402
from trainer.recipes.gpt import GPTRecipe  # noqa: E402


def spec(**hp: object) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "team": "t", "recipe": {"name": "gpt", "hyperparameters": hp}})


# ---- guards ------------------------------------------------------------------------------------------
def test_guard_ignores_a_falling_loss_and_a_lone_blip() -> None:
    g = SpikeGuard(GuardConfig(window=5, confirm_steps=2))
    for i in range(30):
        assert g.observe(i, i, 5.0 - 0.1 * i, 1.0) is None
    assert g.observe(30, 30, 100.0, 1.0) is None  # suspect, not confirmed
    assert g.observe(31, 31, 2.0, 1.0) is None  # the next step is fine: the blip is dropped
    assert g.spikes == 0


def test_guard_confirms_a_spike_over_consecutive_steps() -> None:
    g = SpikeGuard(GuardConfig(window=5, confirm_steps=2, factor=2.0))
    for i in range(10):
        g.observe(i, i, 3.0, 1.0)
    assert g.observe(10, 10, 7.0, 1.0) is None
    spike = g.observe(11, 11, 8.0, 1.0)
    assert spike is not None and spike.first_step == 10 and spike.batches == (10, 11)
    assert spike.loss_mean == pytest.approx(3.0) and g.spikes == 1


def test_guard_flags_grad_norm_outliers() -> None:
    g = SpikeGuard(GuardConfig(window=10, confirm_steps=1, grad_z=4.0))
    for i in range(10):
        g.observe(i, i, 3.0, 1.0 + 0.01 * (i % 3))
    assert g.observe(10, 10, 3.0, 50.0) is not None


def test_guard_never_calls_a_loss_near_zero_a_spike() -> None:
    """A classifier that has learned its data (examples/digits at lr 0.02 for 1000 steps): a loss of 1e-5 with a
    hard batch at 1e-2 now and then is 1000x its mean, and its grad norm an outlier, but no divergence."""
    g = SpikeGuard(GuardConfig(window=5, confirm_steps=2))
    for i in range(10):
        g.observe(i, i, 1e-5, 0.001)
    assert g.observe(10, 10, 0.01, 0.5) is None and g.observe(11, 11, 0.02, 0.5) is None and g.spikes == 0
    low = SpikeGuard(GuardConfig(window=5, confirm_steps=2, min_loss=0.0))  # without the floor: rolled back
    for i in range(10):
        low.observe(i, i, 1e-5, 0.001)
    assert low.observe(10, 10, 0.01, 0.5) is None and low.observe(11, 11, 0.02, 0.5) is not None
    rising = SpikeGuard(GuardConfig(window=5, confirm_steps=2))  # a loss that leaves zero far behind still is
    for i in range(10):
        rising.observe(i, i, 0.01, 0.001)
    assert rising.observe(10, 10, 0.5, 0.5) is None and rising.observe(11, 11, 0.9, 0.5) is not None


def test_guard_needs_a_full_window() -> None:
    g = SpikeGuard(GuardConfig(window=20, confirm_steps=1))
    assert g.observe(0, 0, 3.0, 1.0) is None
    assert g.observe(1, 1, 100.0, 1.0) is None


# ---- data --------------------------------------------------------------------------------------------
def test_batches_are_a_function_of_index_and_resume_exactly() -> None:
    tokens = torch.arange(10_000, dtype=torch.int64) % 251
    a = TokenBatches(tokens=tokens, vocab_size=256, batch_size=4, seq_len=16, rank=0, world_size=1, seed=3)
    seen = [a.next() for _ in range(5)]
    b = TokenBatches(tokens=tokens, vocab_size=256, batch_size=4, seq_len=16, rank=0, world_size=1, seed=3)
    b.load_state_dict({"cursor": 3, "skip": [3]})
    idx, (x, y) = b.next()
    assert idx == 4 and torch.equal(x, seen[4][1][0]) and torch.equal(y, seen[4][1][1])
    assert torch.equal(seen[0][1][0][:, 1:], seen[0][1][1][:, :-1])  # targets are inputs shifted by one


def test_ranks_take_disjoint_slices_of_the_global_batch() -> None:
    def mk(r: int) -> TokenBatches:
        return TokenBatches(tokens=None, vocab_size=64, batch_size=2, seq_len=8, rank=r, world_size=2, seed=0)

    x0, _ = mk(0).batch(7)
    x1, _ = mk(1).batch(7)
    assert not torch.equal(x0, x1)
    full = TokenBatches(tokens=None, vocab_size=64, batch_size=4, seq_len=8, rank=0, world_size=1, seed=0)
    assert torch.equal(torch.cat([x0, x1]), full.batch(7)[0])


# ---- config / recipes / memory / precision -----------------------------------------------------------
def test_hyperparameters_are_typed_and_bounded() -> None:
    assert TrainerConfig.from_spec(spec(lr=0.01)).lr == 0.01
    with pytest.raises(ConfigError, match="lr"):
        TrainerConfig.from_spec(spec(lr=-1.0))


@pytest.mark.parametrize("size", ["tiny", "mini"])
def test_gpt_param_count_matches_the_model(size: str) -> None:
    recipe = load_recipe("gpt", {"size": size})
    model = recipe.build_model()
    assert recipe.param_count() == sum(p.numel() for p in model.parameters())  # tied head counted once
    assert model.get_submodule("lm_head").weight is model.get_submodule("wte").weight


def test_gpt2_124m_config() -> None:
    r = load_recipe("gpt", {"size": "gpt2", "corpus": "synthetic"})
    assert isinstance(r, GPTRecipe)
    assert (r.cfg.n_layer, r.cfg.n_embd, r.cfg.n_head, r.cfg.vocab_size, r.cfg.seq_len) == (12, 768, 12, 50304, 1024)
    assert 124e6 < r.param_count() < 125e6


def test_mlp_recipe_learns() -> None:
    recipe = load_recipe("mlp", {"batch_size": 64})
    torch.manual_seed(0)
    model = recipe.build_model()
    assert recipe.param_count() == sum(p.numel() for p in model.parameters())
    data = recipe.make_data(rank=0, world_size=1, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    for _ in range(40):
        _, batch = data.next()
        loss = recipe.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_unknown_recipe_is_a_user_error() -> None:
    with pytest.raises(RecipeError):
        load_recipe("nope", {})
    with pytest.raises(ConfigError):
        load_recipe("gpt", {"size": "huge"})


def test_memory_prediction_terms() -> None:
    p = memory.predict(
        param_count=1000,
        activation_bytes=50_000,
        precision="bf16",
        strategy="ddp",
        world_size=2,
        largest_block_params=100,
    )
    b = p["breakdown"]
    assert (b["weights"], b["optimizer"], b["autocast_copies"]) == (4000, 8000, 2000)
    assert p["predicted_peak_bytes"] == 4000 + 8000 + 2000 + 50_000
    sharded = memory.predict(
        param_count=1000,
        activation_bytes=50_000,
        precision="fp32",
        strategy="fsdp",
        world_size=4,
        largest_block_params=100,
    )
    assert sharded["breakdown"]["weights"] == 1000 and sharded["breakdown"]["fsdp_unsharded"] == 800


def test_precision_auto_and_scaler_seed_values() -> None:
    cpu = torch.device("cpu")
    assert resolve("auto", cpu) == "fp32"
    ctx = PrecisionContext.create("fp16", cpu)
    assert ctx.scaler is not None and ctx.scaler.get_scale() == SCALER_INIT
    assert ctx.scaler.get_growth_factor() == 2.0 and ctx.scaler.get_backoff_factor() == 0.5
    assert ctx.scaler.get_growth_interval() == 2000


# ---- checkpoints -------------------------------------------------------------------------------------
def _tel(tmp: pathlib.Path) -> Telemetry:
    return Telemetry(tmp / "run", 0)


def _checkpointer(root: pathlib.Path, tel: Telemetry) -> Checkpointer:
    """One rank's asynchronous, unsharded checkpointer on CPU that keeps the last two checkpoints."""
    return Checkpointer(
        root,
        rank=0,
        world_size=1,
        token=None,
        keep_last=2,
        asynchronous=True,
        sharded=False,
        group=None,
        device=torch.device("cpu"),
        telemetry=tel,
    )


def test_manifest_detects_a_flipped_byte(tmp_path: pathlib.Path) -> None:
    tmp = tmp_path / ".tmp-x"
    tmp.mkdir()
    (tmp / "a.bin").write_bytes(b"hello world" * 100)
    write_manifest_and_commit(tmp, tmp_path / "step_00000001", step=1, token=None, meta={})
    final = tmp_path / "step_00000001"
    assert verify(final) is None
    data = bytearray((final / "a.bin").read_bytes())
    data[10] ^= 1
    (final / "a.bin").write_bytes(bytes(data))
    assert "sha256" in (verify(final) or "")


def test_fence_blocks_the_commit(tmp_path: pathlib.Path) -> None:
    (tmp_path / "fence").write_text("8\n")
    tmp = tmp_path / ".tmp-y"
    tmp.mkdir()
    (tmp / "a.bin").write_bytes(b"x")
    with pytest.raises(FencedError):
        write_manifest_and_commit(tmp, tmp_path / "step_00000002", step=2, token=7, meta={})
    assert list_checkpoints(tmp_path) == [] and not tmp.exists()


def test_checkpointer_roundtrip_and_keep_last(tmp_path: pathlib.Path) -> None:
    tel = _tel(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = _checkpointer(tmp_path / "ckpt", tel)
    for step in (1, 2, 3):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        ck.save(step, model, opt, {"step": step})
    ck.wait()
    assert [s for s, _ in list_checkpoints(tmp_path / "ckpt")] == [2, 3]
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    path = ck.choose()
    assert path is not None and path.name == "step_00000003"
    assert ck.load(path, model, opt) == {"step": 3}
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k])
    assert opt.state_dict()["state"][0]["step"].item() == 3
    tel.close()
    recs = [json.loads(x) for x in (tmp_path / "run" / "telemetry" / "rank0.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "checkpoint"] == [1, 2, 3]


def test_telemetry_reports_nonfinite_as_null(tmp_path: pathlib.Path) -> None:
    tel = _tel(tmp_path)
    from core.trainer_protocol import RecordKind

    tel.emit(RecordKind.STEP, step=1, loss=float("nan"), grad_norm=float("inf"))
    tel.close()
    rec = json.loads((tmp_path / "run" / "telemetry" / "rank0.jsonl").read_text())
    assert rec["loss"] is None and rec["grad_norm"] is None and rec["rank"] == 0 and rec["kind"] == "step"


def test_raw_checkpoint_keeps_tied_weights_scalars_and_layout(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw format: several data files hashed while written, tied weights stored once, exact restore."""
    monkeypatch.setenv("KILN_CKPT_WRITERS", "3")
    tel = _tel(tmp_path)
    torch.manual_seed(0)
    recipe = GPTRecipe(
        {"size": "tiny", "n_layer": 1, "batch_size": 2, "seq_len": 16, "corpus": "synthetic", "vocab_size": 64}
    )
    model = recipe.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randint(0, 64, (2, 16))
    model(x, x).backward()
    opt.step()
    ck = _checkpointer(tmp_path / "ckpt", tel)
    ck.prepare(model, opt)
    ck.save(1, model, opt, {"step": 1}, blocking=True)
    path = ck.choose()
    assert path is not None and verify(path) is None
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "raw"
    assert sorted(f for f in manifest["files"] if f.startswith("data_")) == ["data_0.bin", "data_1.bin", "data_2.bin"]
    entries = json.loads((path / "tensors.json").read_text())
    wte = model.wte.weight
    assert sum(e["shape"] == list(wte.shape) and e["dtype"] == "float32" for e in entries) == 3  # w, m, v
    expected_model = {k: v.clone() for k, v in model.state_dict().items()}
    expected_opt = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    fresh = recipe.build_model()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    assert ck.load(path, fresh, fresh_opt) == {"step": 1}
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, expected_model[k]), k
    assert fresh.lm_head.weight is fresh.wte.weight
    for k, v in fresh_opt.state_dict()["state"][0].items():
        assert torch.equal(v, expected_opt[k]), k
    tel.close()


def test_exit_record_is_the_last_line(tmp_path: pathlib.Path) -> None:
    from trainer.parallel import DistEnv
    from trainer.run import run

    # A spec file the API never checked (written by hand): the trainer refuses it as a user error all the same.
    spec = JobSpec.model_validate(
        {"name": "x", "team": "t", "steps": 1, "recipe": {"name": "gpt", "hyperparameters": {"size": "nope"}}}
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)
    assert run(spec, tmp_path, env) == 2
    last = json.loads((tmp_path / "telemetry" / "rank0.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "event" and last["type"] == "EXIT"
    assert last["fields"]["exit_code"] == 2 and last["fields"]["reason"] == "USER_ERROR"
    assert last["fields"]["error"].startswith("reading the hyperparameters: ConfigError: recipe.hyperparameters.size")


def test_rss_watch_is_cheap_and_kernels_load_in_process_on_local_hit() -> None:
    import torch._inductor.config as inductor_config

    from trainer.compile import _in_process_kernels
    from trainer.compile_breaker import RssTree

    tree = RssTree(refresh_s=60.0)
    first = tree()
    listed = tree.listed
    assert first > 0 and tree() > 0 and tree.listed == listed  # the worker list is not re-walked each poll
    before = inductor_config.compile_threads
    with _in_process_kernels(True):
        assert inductor_config.compile_threads == 1
    assert inductor_config.compile_threads == before
    with _in_process_kernels(False):
        assert inductor_config.compile_threads == before


def test_compile_preload_records_package_modules_and_imports_them_back(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys
    import types

    from trainer import compile_preload

    before = set(sys.modules)
    monkeypatch.setitem(sys.modules, "torch._kiln_probe_loaded", types.ModuleType("torch._kiln_probe_loaded"))
    monkeypatch.setitem(sys.modules, "kiln_generated_kernel", types.ModuleType("kiln_generated_kernel"))
    compile_preload.record(before, tmp_path)
    assert compile_preload.recorded(tmp_path) == ["torch._kiln_probe_loaded"]  # only installed packages' modules
    compile_preload.record(before, tmp_path)  # nothing new: the file is unchanged
    assert json.loads((tmp_path / compile_preload.MODULES_FILE).read_text()) == ["torch._kiln_probe_loaded"]
    (tmp_path / compile_preload.MODULES_FILE).write_text("{not json")
    assert compile_preload.recorded(tmp_path) == []  # a damaged list costs the preload, nothing else

    # The background import: names already loaded are skipped, a name that no longer imports is counted.
    monkeypatch.delitem(sys.modules, "torch.utils.bundled_inputs", raising=False)
    job = compile_preload._Preload(["torch.utils.bundled_inputs", "torch._no_such_module_any_more", "json"])
    job.thread.start()
    job.thread.join()
    assert (job.imported, job.failed) == (1, 1)
    assert "torch.utils.bundled_inputs" in sys.modules


def test_compile_preload_wait_without_a_start_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer import compile_preload

    monkeypatch.setattr(compile_preload, "_active", None)
    assert compile_preload.wait() == {"preload_wait_s": 0.0}


@pytest.mark.parametrize(
    ("asked", "device", "strategy", "on"),
    [
        (True, "cuda", "ddp", True),
        (True, "cpu", "ddp", False),
        (True, "cuda", "fsdp", False),
        (False, "cuda", "ddp", False),
    ],
)
def test_cuda_graphs_only_on_a_gpu_unsharded(asked: bool, device: str, strategy: str, on: bool) -> None:
    from trainer.builders import cuda_graphs_on

    spec = JobSpec.model_validate(
        {"name": "x", "team": "t", "compile": {"cuda_graphs": asked}, "recipe": {"name": "gpt"}}
    )
    assert cuda_graphs_on(spec, torch.device(device), strategy) is on
