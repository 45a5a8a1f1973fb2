"""The job spec: one schema for YAML and JSON submissions, shared by the API, the scheduler and the trainer.

Unknown fields are rejected (``extra="forbid"``) so a typo never silently turns into a default.
Sizes are bytes, durations seconds.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from core.code_archive import DIGEST_PATTERN
from core.recipes import HyperparameterError, TrainingHyperparameters
from core.recipes import validate as validate_recipe

NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$"

Parallelism = Literal["ddp", "fsdp", "auto"]
Precision = Literal["bf16", "fp16", "fp32", "auto"]
CompileMode = Literal["auto", "regional", "whole", "off"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuShare(StrictModel):
    """A fraction of one GPU, shared through MPS with other fractional jobs of the same team (docs/scheduler.md,
    "GPU sharing"). A field left out takes the QoS class's value: its GPU memory cap, its SM percentage."""

    memory_gb: Annotated[float | None, Field(gt=0, le=4096, description="GPU memory, GiB (MPS-enforced).")] = None
    sm_percent: Annotated[int | None, Field(ge=1, le=100, description="Share of the GPU's SMs, percent.")] = None


class Resources(StrictModel):
    gpus: Annotated[int, Field(ge=0, le=4096, description="Total GPUs (0 = CPU slots only).")] = 1
    gpus_per_node: Annotated[int | None, Field(ge=1, le=64)] = None
    gpu_type: Annotated[str | None, Field(max_length=64, description="e.g. 'H200'; None = any.")] = None
    cpu_slots: Annotated[int, Field(ge=1, le=1024, description="Processes when gpus == 0.")] = 1
    host_memory_bytes: Annotated[
        int | None,
        Field(
            ge=64 * 2**20,
            le=2**50,
            description="Host memory on each host (default: the host's share per "
            "process); the worker enforces it, within its host's maximum.",
        ),
    ] = None

    gpu_share: Annotated[
        GpuShare | None,
        Field(description="Run on a fraction of one GPU (needs gpus: 1); {} takes the QoS class's caps."),
    ] = None

    @model_validator(mode="after")
    def _per_node_divides(self) -> Resources:
        if self.gpus_per_node is not None and self.gpus and self.gpus % self.gpus_per_node:
            raise ValueError("gpus must be a multiple of gpus_per_node")
        if self.gpu_share is not None and self.gpus != 1:
            raise ValueError(f"gpu_share is a fraction of one GPU: it needs gpus: 1 (got gpus: {self.gpus})")
        return self

    @property
    def nodes(self) -> int:
        if not self.gpus or not self.gpus_per_node:
            return 1
        return self.gpus // self.gpus_per_node

    @property
    def processes(self) -> int:
        return self.gpus if self.gpus else self.cpu_slots


class CompileOptions(StrictModel):
    # auto: whole-model on GPU (fastest measured on the H200), per-block on CPU (compiles several times faster)
    mode: CompileMode = "auto"
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 300.0
    max_rss_bytes: Annotated[int | None, Field(gt=0)] = None
    check_allclose: bool = True
    # CUDA graphs (torch.compile's "reduce-overhead"): the compiled forward and backward are replayed as graphs,
    # so the host launches a few graphs a step instead of hundreds of kernels. Pays where the host, not the GPU,
    # sets the step time (small models, short steps); GPU only (a CPU run ignores it), never with FSDP sharding.
    cuda_graphs: bool = False

    @model_validator(mode="after")
    def _graphs_need_compile(self) -> CompileOptions:
        if self.cuda_graphs and self.mode == "off":
            raise ValueError("cuda_graphs replays the compiled graph: it needs a compile mode other than off")
        return self


class Checkpointing(StrictModel):
    every_steps: Annotated[int | None, Field(ge=1)] = 100
    every_seconds: Annotated[float | None, Field(gt=0)] = None
    # auto: kiln chooses the interval at submit (Young/Daly from the predicted checkpoint cost and the failure rate
    # seen on the GPU type: core.services.auto_choices), stores it as every_seconds and says why in the SUBMITTED
    # event; the stored spec no longer says auto.
    every: Annotated[
        Literal["auto"] | None,
        Field(description="auto: kiln chooses the interval (Young/Daly) in place of every_steps / every_seconds."),
    ] = None
    keep_last: Annotated[int, Field(ge=1, le=100)] = 3
    asynchronous: bool = True
    # Tiered checkpoints: every checkpoint is committed to the host's fast local tier (tmpfs or local NVMe, a
    # worker setting: the spec names no path, so no job can aim a write outside kiln's own per-job
    # directories) and every ``persist_every``-th one is also copied, in the background, to the durable dir
    # (the source of truth for restarts on another host).  The final and the preemption checkpoint are
    # always made durable.  A host without a local tier writes every checkpoint to the durable dir.
    local_tier: Annotated[bool, Field(description="Commit every checkpoint to the host's fast local tier.")] = False
    persist_every: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    # The free path this replaced: refused with the name of its replacement (not "extra inputs").
    local_dir: SkipJsonSchema[Any] = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _auto_or_given(self) -> Checkpointing:
        if self.every == "auto" and self.model_fields_set & {"every_steps", "every_seconds"}:
            raise ValueError("every: auto chooses the interval: give it, or every_steps / every_seconds, not both")
        return self

    @field_validator("local_dir")
    @classmethod
    def _no_free_path(cls, v: Any) -> None:
        if v is not None:
            raise ValueError(
                "a spec no longer names a directory; use `local_tier: true` (the host's fast local directory is "
                "a worker setting, KILN_LOCAL_TIER_DIR)"
            )
        return None


class SLAOverrides(StrictModel):
    qos: Annotated[str | None, Field(max_length=32)] = None
    max_queue_wait_s: Annotated[float | None, Field(gt=0, le=365 * 86400)] = None
    deadline: Annotated[str | None, Field(description="ISO-8601 UTC timestamp")] = None
    max_restarts: Annotated[int | None, Field(ge=0, le=1000)] = None
    recovery_time_objective_s: Annotated[float | None, Field(gt=0, le=86400)] = None
    checkpoint_interval_s: Annotated[float | None, Field(gt=0, le=86400)] = None
    min_checkpoint_success_rate: Annotated[float | None, Field(ge=0, le=1)] = None
    step_time_tolerance: Annotated[float | None, Field(ge=1, le=100)] = None

    @field_validator("deadline")
    @classmethod
    def _iso(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from datetime import datetime

        try:
            parsed = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError as exc:
            raise ValueError("deadline must be an ISO-8601 timestamp") from exc
        if parsed.tzinfo is None:
            raise ValueError("deadline must carry a timezone (UTC)")
        return parsed.isoformat()


class Recipe(StrictModel):
    name: Annotated[str, Field(max_length=128, description="A recipe in the 'kiln.recipes' entry-point group.")]
    hyperparameters: dict[str, Annotated[Any, Field()]] = Field(default_factory=dict)

    @field_validator("hyperparameters")
    @classmethod
    def _scalars(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if not isinstance(value, (int, float, str, bool, type(None), list)):
                raise ValueError(f"hyperparameter {key!r} must be a scalar or a list")
            if len(key) > 64:
                raise ValueError("hyperparameter names are at most 64 characters")
        if len(v) > 64:
            raise ValueError("at most 64 hyperparameters")
        return v


MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class Code(StrictModel):
    """The team's own code (docs/user-code.md): an uploaded archive, named by its SHA-256, and the module in it
    that implements the recipe protocol. ``kiln submit --workdir DIR`` uploads DIR and fills in the digest."""

    digest: Annotated[
        str | None, Field(pattern=DIGEST_PATTERN, description="SHA-256 of the uploaded archive (hex).")
    ] = None
    entry_point: Annotated[
        str | None,
        Field(
            pattern=MODULE_PATTERN,
            max_length=200,
            description="The recipe module, e.g. 'digits' (a `recipe:` job; a `command:` job names none).",
        ),
    ] = None


MAX_COMMAND_ARGS = 256
MAX_COMMAND_ARG = 4096


class JobSpec(StrictModel):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    team: Annotated[str, Field(pattern=NAME_PATTERN)]
    recipe: Recipe | None = None
    # Script mode (docs/user-code.md): an argv run from the uploaded code's directory under torchrun, one process
    # per GPU (or per CPU slot), instead of a recipe run by kiln's trainer. Exactly one of `recipe` and `command`.
    command: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_COMMAND_ARG)]] | None,
        Field(
            min_length=1,
            max_length=MAX_COMMAND_ARGS,
            description="Script mode: an argv run from the uploaded code's directory (kiln submit --workdir), "
            "e.g. ['python', 'train.py']; the alternative to `recipe`.",
        ),
    ] = None
    code: Code | None = None
    steps: Annotated[int, Field(ge=1, le=10_000_000)] = 100
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    resources: Resources = Resources()
    parallelism: Parallelism = "auto"
    compile: CompileOptions = CompileOptions()
    precision: Precision = "auto"
    deterministic: Annotated[
        bool,
        Field(
            description="Bitwise-reproducible training: deterministic kernels only (torch's deterministic "
            "algorithms, a fixed cuBLAS workspace, no on-device autotuning in the compiler); slower."
        ),
    ] = False
    checkpointing: Checkpointing = Checkpointing()
    sla: SLAOverrides = SLAOverrides()
    datasets: Annotated[
        list[Annotated[str, Field(pattern=NAME_PATTERN)]],
        Field(
            max_length=16,
            description="The team's registered datasets the job reads, by name (kiln datasets ls): "
            "each is mounted read-only for the attempt. A spec never names a host path.",
        ),
    ] = Field(default_factory=list)
    depends_on: Annotated[list[str], Field(max_length=32)] = Field(default_factory=list)
    time_limit_s: Annotated[float | None, Field(gt=0, le=30 * 86400)] = None
    labels: Annotated[dict[str, Annotated[str, Field(max_length=128)]], Field(max_length=32)] = Field(
        default_factory=dict
    )

    @model_validator(mode="after")
    def _recipe_or_command(self) -> JobSpec:
        if self.recipe is None and self.command is None:
            raise ValueError(
                "a job runs either a `recipe:` (a built-in one, or your module through `code.entry_point`) or a "
                "`command:` (your script, from the directory kiln submit --workdir uploads): give one"
            )
        if self.recipe is not None and self.command is not None:
            raise ValueError('give either `recipe:` or `command:`, not both (docs/user-code.md, "Script mode")')
        if self.command is not None and self.code is not None and self.code.entry_point is not None:
            raise ValueError("code.entry_point names a recipe module; a `command:` job runs its command instead")
        if self.recipe is not None and self.code is not None and self.code.entry_point is None:
            raise ValueError("code.entry_point is required with `recipe:` (the module of your code that is the recipe)")
        return self

    @property
    def is_script(self) -> bool:
        """Script mode: the job runs its own ``command`` (not kiln's trainer)."""
        return self.command is not None

    @property
    def recipe_name(self) -> str:
        """The recipe's name, or ``script`` for a job that runs its own command."""
        return self.recipe.name if self.recipe is not None else "script"

    @field_validator("datasets")
    @classmethod
    def _unique_datasets(cls, v: list[str]) -> list[str]:
        twice = sorted({n for n in v if v.count(n) > 1})
        if twice:
            raise ValueError(f"a dataset is named once: {', '.join(twice)} appears more than once")
        return v


def runs_team_code(spec: dict[str, Any]) -> bool:
    """Whether a job (its stored spec) runs code of its team's, an uploaded archive or a script, rather than only
    kiln's own recipes: such a job runs only on hosts that sandbox it (``workers.isolation``)."""
    return bool((spec.get("code") or {}).get("digest") or spec.get("command"))


class SpecError(ValueError):
    """A spec that failed to parse or validate; ``errors`` carry field paths for problem+json."""

    def __init__(self, message: str, errors: list[dict[str, Any]]):
        super().__init__(message)
        self.errors = errors


NAME_RULE = (
    "1 to 64 characters: lowercase letters, digits, '.', '_' and '-', beginning and ending with a letter or digit"
)
YAML_BOOLEAN_HINT = "YAML reads unquoted off, no, on and yes as booleans: quote the word"


def validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """pydantic's errors, each saying the field (``loc``), the value it got and, where one is close, the name that
    was probably meant."""
    return [
        {"loc": ".".join(str(p) for p in err["loc"]) or "$", "msg": _explain(err), "type": err["type"]}
        for err in exc.errors()
    ]


def _explain(err: Any) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    msg = str(err["msg"]).removeprefix("Value error, ")  # a validator's own sentence, without pydantic's label
    if kind == "extra_forbidden":
        name = str(err["loc"][-1])
        known = fields_at(err["loc"][:-1])
        return f"unknown field {name!r}{did_you_mean(name, known)}" + (
            f" (fields here: {', '.join(known)})" if known else ""
        )
    if kind == "string_pattern_mismatch" and ctx.get("pattern") == NAME_PATTERN:
        return f"{value!r} is not a valid name: {NAME_RULE}"
    if isinstance(value, bool) and kind in ("literal_error", "string_type", "enum"):
        field = err["loc"][-1] if err["loc"] else "value"
        return f"{msg}, got the boolean {str(value).lower()}: {YAML_BOOLEAN_HINT} ({field}: 'off')"
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"{msg}, got {value!r}{did_you_mean(str(value), allowed)}"
    if isinstance(value, (str, int, float)) and not isinstance(value, bool) and len(repr(value)) <= 80:
        return f"{msg}, got {value!r}"
    return msg


def did_you_mean(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def fields_at(loc: tuple[Any, ...] | list[Any]) -> list[str]:
    """The fields a spec accepts at ``loc`` (``()`` = the top level), or [] where it is not a section."""
    model: Any = JobSpec
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = _model_in(field.annotation) if field is not None else None
        if model is None:
            return []
    return [name for name, f in model.model_fields.items() if not f.exclude]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    candidates = (annotation, *get_args(annotation))
    return next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _at(mark: Any, text: str) -> str:
    line, column = mark.line, mark.column
    if line > text.count("\n"):  # libyaml's end of a text without a last newline: the line after it
        line, column = text.count("\n"), len(text.rsplit("\n", 1)[-1])
    return f"line {line + 1}, column {column + 1}"


def yaml_error(exc: yaml.YAMLError, text: str) -> SpecError:
    """Malformed YAML as a person reads it: ``line 2, column 2: expected ',' or ']', but got ':' (while parsing a
    flow sequence from line 1, column 4)``. PyYAML's own text quotes its source as ``"<unicode string>"`` and the
    error item's path was ``$``."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return SpecError("malformed YAML", [{"loc": "$", "msg": str(exc), "type": "yaml"}])
    problem = getattr(exc, "problem", None) or "not valid YAML"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        problem += f" ({context}" + (f" from {_at(context_mark, text)})" if context_mark is not None else ")")
    where = _at(mark, text)
    return SpecError(f"malformed YAML at {where}", [{"loc": where, "msg": problem, "type": "yaml"}])


def parse_spec_text(text: str) -> JobSpec:
    """Parse YAML (a superset of JSON) and validate it."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, text) from None
    return parse_spec_data(data)


def parse_spec_data(data: object) -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError("a job spec is a mapping", [{"loc": "$", "msg": "expected a mapping", "type": "type"}])
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        errors = validation_errors(exc)
        first = errors[0]
        raise SpecError(f"invalid job spec: {first['loc']}: {first['msg']}", errors) from exc
    check_recipe(spec)
    return spec


def check_recipe(spec: JobSpec) -> TrainingHyperparameters | None:
    """The recipe's name and typed hyperparameters (None for a recipe another package installs, or the team's own
    code: its hyperparameter model is in its archive, checked by ``kiln submit --check`` and by the trainer; or a
    script, which has none)."""
    if spec.recipe is None:
        return None
    if spec.code is not None:
        ours = {k: v for k, v in spec.recipe.hyperparameters.items() if k in TrainingHyperparameters.model_fields}
        try:
            TrainingHyperparameters.model_validate(ours)
        except ValidationError as exc:
            errors = [{**e, "loc": f"recipe.hyperparameters.{e['loc']}"} for e in validation_errors(exc)]
            raise SpecError(f"invalid job spec: {errors[0]['loc']}: {errors[0]['msg']}", errors) from None
        return None
    try:
        return validate_recipe(spec.recipe.name, spec.recipe.hyperparameters)
    except HyperparameterError as exc:
        raise SpecError(f"invalid job spec: {exc}", exc.errors) from None
