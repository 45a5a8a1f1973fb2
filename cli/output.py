"""Rendering: rich tables for people, JSON for scripts (``--output json`` prints exactly what the API returned).

Whatever the API returns is text, never markup or terminal control: every value shown goes through ``safe``
(control characters and direction overrides made visible as ``\\xNN``/``\\uNNNN``) into a rich ``Text`` (not
parsed as markup), so an event message, a cancel reason or a job's log cannot become a link, restyle or clear
the terminal, or crash the command with a markup error."""

from __future__ import annotations

import enum
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.states import TERMINAL, JobState


def _width(stream: object) -> int | None:
    """A terminal's own width; piped output is not folded at 80 columns (``kiln ls | grep`` finds whole rows)."""
    isatty = getattr(stream, "isatty", None)
    if (callable(isatty) and isatty()) or os.environ.get("COLUMNS"):
        return None
    return 400


console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


STATE_STYLES: dict[str, str] = {
    JobState.QUEUED: "yellow",
    JobState.ADMITTED: "cyan",
    JobState.RUNNING: "bold green",
    JobState.PREEMPTING: "magenta",
    JobState.PAUSED: "magenta",
    JobState.SUCCEEDED: "green",
    JobState.FAILED: "bold red",
    JobState.CANCELLED: "dim",
    JobState.LOST: "red",
}

TERMINAL_STATES = frozenset(s.value for s in TERMINAL)


# C0 controls but tab and newline, DEL, C1 controls (ESC-less CSI/OSC on some terminals), bidi overrides.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe(value: Any) -> str:
    """Text from the API as a terminal may show it: control characters visible, never acting."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", str(value))


def text(value: Any, style: str = "") -> Text:
    """``safe`` text that rich does not parse as markup."""
    return Text(safe(value), style=style)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_data(data: Any, fmt: OutputFormat) -> None:
    """``-o json`` or ``-o yaml``: the API's answer as it is, for scripts."""
    if fmt is OutputFormat.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False))
        sys.stdout.flush()
    else:
        print_json(data)


# -- value formatting (pure) ------------------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def fmt_duration(seconds: float | None) -> str:
    """3 -> '3s', 75 -> '1m15s', 3700 -> '1h01m', 90000 -> '1d01h'."""
    if seconds is None:
        return "-"
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def fmt_age(value: Any, now: datetime | None = None) -> str:
    dt = parse_time(value)
    if dt is None:
        return "-"
    now = now or datetime.now(UTC)
    return fmt_duration((now - dt).total_seconds()) + " ago"


def fmt_time(value: Any) -> str:
    dt = parse_time(value)
    return "-" if dt is None else dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def expected_start(why: dict[str, Any]) -> str | None:
    """A queued job's expected start as ``GET /v1/jobs/{id}/why`` gives it, in the words ``kiln why`` and ``kiln
    describe`` both print: a range of times and where, with how it is known; or why it cannot be known."""
    basis = why.get("expected_start_basis")
    if not why.get("expected_start"):
        return basis
    early, late = fmt_time(why["expected_start"]), fmt_time(why.get("expected_start_latest"))
    when = early if late in ("-", early) else f"{early} to {late}"
    hosts = why.get("expected_start_hosts") or []
    where = f" on {', '.join(hosts)}" if hosts else ""
    return f"{when}{where} ({basis})" if basis else f"{when}{where}"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_rate(n: float | None) -> str:
    """Bandwidth in bytes/s shown as GB/s (decimal, as link speeds are quoted)."""
    if n is None:
        return "-"
    return f"{n / 1e9:g} GB/s"


def fmt_loss(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def fmt_value(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    return str(value)


def state_text(state: str | None) -> Text:
    state = state or "-"
    return text(state, STATE_STYLES.get(state, ""))


def job_wait_or_runtime(job: dict[str, Any], now: datetime | None = None) -> str:
    """How long a job has waited (queued) or run (running), or ran in all (finished)."""
    now = now or datetime.now(UTC)
    submitted = parse_time(job.get("submitted_at"))
    started = parse_time(job.get("started_at"))
    finished = parse_time(job.get("finished_at"))
    waiting = parse_time(job.get("waiting_since"))
    held = parse_time(job.get("held_at"))
    if held and job.get("state") == "QUEUED":
        return "held " + fmt_duration((now - held).total_seconds())  # its wait is paused
    if waiting and job.get("state") == "QUEUED":
        return fmt_duration((now - waiting).total_seconds())  # back in the queue: this wait, not the first start
    if finished and started:
        return fmt_duration((finished - started).total_seconds())
    if started:
        return fmt_duration((now - started).total_seconds())
    if submitted:
        return fmt_duration(((finished or now) - submitted).total_seconds())
    return "-"


def job_queued(job: dict[str, Any], now: datetime | None = None) -> str:
    """Its time in the queue, all waits counted (the first and every requeue), as its queue-wait SLA counts it."""
    if "queued_s" not in job:
        return "-"  # an API from before the field
    total = float(job.get("queued_s") or 0.0)
    since = parse_time(job.get("waiting_since"))
    if since is not None:
        total += max(0.0, ((now or datetime.now(UTC)) - since).total_seconds())
    if job.get("held_at"):
        return fmt_duration(total) + " (paused while held)"
    return fmt_duration(total) + (" so far" if since is not None else "")


def job_progress(job: dict[str, Any]) -> str:
    steps = job.get("steps") or (job.get("spec") or {}).get("steps")
    last = job.get("last_step") or 0
    return f"{last}/{steps}" if steps else str(last)


def job_note(job: dict[str, Any]) -> str:
    state = job.get("state")
    if state == JobState.QUEUED and job.get("pending_reason"):
        return str(job["pending_reason"])
    if state in {JobState.FAILED, JobState.CANCELLED, JobState.LOST} and job.get("exit_reason"):
        return str(job["exit_reason"])
    return ""


# -- tables -----------------------------------------------------------------------------------------------------


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def table(columns: Sequence[Column], rows: Iterable[dict[str, Any]], *, title: str | None = None) -> Table:
    t = Table(title=title, header_style="bold", box=None, pad_edge=False, show_edge=False)
    for header, _ in columns:
        justify = "right" if header.isupper() and header in {"ID", "GPUS", "PRIO", "RESTARTS", "STEP"} else "left"
        t.add_column(header, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        cells: list[Text] = []
        for _, get in columns:
            value = get(row)
            cells.append(value if isinstance(value, Text) else text(fmt_value(value)))
        t.add_row(*cells)
    return t


def job_gpus(j: dict[str, Any]) -> Any:
    """GPUs, or a fractional job's share of one: ``share 40G/50%`` (what the spec leaves out is its class's)."""
    share = ((j.get("spec") or {}).get("resources") or {}).get("gpu_share")
    if share is None:
        return j.get("gpus")
    memory, sm = share.get("memory_gb"), share.get("sm_percent")
    return "share " + "/".join([f"{memory:g}G" if memory else "class", f"{sm}%" if sm else "class"])


JOB_COLUMNS: list[Column] = [
    ("ID", lambda j: j.get("id")),
    ("NAME", lambda j: j.get("name")),
    ("TEAM", lambda j: j.get("team")),
    ("USER", lambda j: j.get("user")),
    ("QOS", lambda j: j.get("qos")),
    ("STATE", lambda j: state_text(j.get("state"))),
    ("GPUS", job_gpus),
    ("STEP", job_progress),
    ("LOSS", lambda j: fmt_loss(j.get("last_loss"))),
    ("TIME", job_wait_or_runtime),
    ("SUBMITTED", lambda j: fmt_age(j.get("submitted_at"))),
    ("REASON", job_note),
]

EVENT_COLUMNS: list[Column] = [
    ("TIME", lambda e: fmt_time(e.get("created_at"))),
    ("TYPE", lambda e: e.get("type")),
    ("ACTOR", lambda e: e.get("actor") or ""),
    ("MESSAGE", lambda e: e.get("message") or ""),
]

ATTEMPT_COLUMNS: list[Column] = [
    ("#", lambda a: a.get("number")),
    ("STATE", lambda a: a.get("state")),
    ("PLACEMENT", lambda a: fmt_placement(a.get("placement"))),
    ("STARTED", lambda a: fmt_time(a.get("started_at"))),
    ("ENDED", lambda a: fmt_time(a.get("ended_at"))),
    ("RESUMED AT", lambda a: a.get("resumed_from_step")),
    ("EXIT", lambda a: a.get("exit_code")),
    ("REASON", lambda a: a.get("exit_reason") or ""),
]

CHECKPOINT_COLUMNS: list[Column] = [
    ("STEP", lambda c: c.get("step")),
    ("SIZE", lambda c: fmt_bytes(c.get("bytes"))),
    ("VERIFIED", lambda c: c.get("verified")),
    ("SHA256", lambda c: str(c.get("sha256") or "")[:12]),
    ("TIME", lambda c: fmt_time(c.get("created_at"))),
    ("PATH", lambda c: c.get("path")),
]

METRIC_COLUMNS: list[Column] = [
    ("STEP", lambda m: m.get("step")),
    ("LOSS", lambda m: fmt_loss(m.get("loss"))),
    ("GRAD NORM", lambda m: fmt_loss(m.get("grad_norm"))),
    ("TOKENS/S", lambda m: f"{m['tokens_per_s']:.0f}" if m.get("tokens_per_s") is not None else "-"),
    ("STEP TIME", lambda m: f"{m['step_time_s']:.3f}s" if m.get("step_time_s") is not None else "-"),
    ("PEAK MEM", lambda m: fmt_bytes(m.get("mem_peak_bytes"))),
    ("TIME", lambda m: fmt_time(m.get("ts"))),
]

TEAM_COLUMNS: list[Column] = [
    ("NAME", lambda t: t.get("name")),
    ("QUOTAS", lambda t: fmt_quotas(t.get("quotas"))),
    ("QOS", lambda t: ",".join(t.get("qos_classes") or []) or "-"),
    ("RESTARTS", lambda t: t.get("restart_limit")),
    ("COHORT", lambda t: t.get("cohort")),
    ("FAIR SHARE", lambda t: t.get("fair_share_weight")),
    ("BUDGET (GPU-H)", lambda t: t.get("gpu_hour_budget")),
]

USAGE_COLUMNS: list[Column] = [
    ("TEAM", lambda u: u.get("team")),
    ("USED (GPU-H)", lambda u: f"{float(u.get('used_gpu_hours') or 0):.2f}"),
    ("BUDGET", lambda u: u.get("budget_gpu_hours")),
    ("REMAINING", lambda u: u.get("remaining_gpu_hours")),
    ("BY TYPE", lambda u: ", ".join(f"{k}={v:.2f}" for k, v in (u.get("by_gpu_type") or {}).items())),
    ("COMPILE HITS", lambda u: fmt_compile_hits(u.get("compile_cache"))),
    ("COMPILE SAVED", lambda u: fmt_compile_saved(u.get("compile_cache"))),
]


# How far kiln's forecasts were from what happened (GET /v1/usage's ``forecasts``): one row per kind and source.
FORECAST_COLUMNS: list[Column] = [
    ("KIND", lambda e: forecast_kind(e.get("kind"))),
    ("SOURCE", lambda e: e.get("source")),
    ("MADE", lambda e: e.get("forecasts")),
    ("UNKNOWN", lambda e: e.get("unknown")),
    ("MEASURED", lambda e: e.get("measured")),
    ("MEDIAN |ERR|", lambda e: fmt_error(e, "median_abs_error")),
    ("P90 |ERR|", lambda e: fmt_error(e, "p90_abs_error")),
    ("MEDIAN ERR", lambda e: fmt_error(e, "median_error", signed=True)),
    ("MEDIAN REL", lambda e: fmt_share(e.get("median_rel_error"))),
    ("P90 REL", lambda e: fmt_share(e.get("p90_rel_error"))),
    ("IN RANGE", lambda e: "-" if e.get("in_range") is None else f"{e['in_range']}/{e.get('measured')}"),
]


def forecast_kind(kind: Any) -> str:
    return "GPU-hours" if kind == "gpu_hours" else str(kind or "").replace("_", " ")


def fmt_error(summary: dict[str, Any], key: str, *, signed: bool = False) -> str:
    """A forecast error in its kind's unit: '0.031s', '4m00s', '1.0 GiB', '0.0052' (GPU-hours); ``signed``: '+' when
    the job came out later, bigger or slower than forecast."""
    value = summary.get(key)
    return "-" if value is None else fmt_amount(float(value), summary.get("unit"), signed=signed)


def fmt_amount(value: float, unit: Any, *, signed: bool = False) -> str:
    size = abs(value)
    sign = ("+" if value > 0 else "-" if value < 0 else "") if signed else ""
    if unit == "s":
        return sign + (f"{size:.3g}s" if size < 60 else fmt_duration(size))
    if unit == "bytes":
        return sign + fmt_bytes(size)
    return sign + (f"{size:.2f}" if size >= 1 else f"{size:.2g}")  # GPU-hours: a small job's are thousandths


def fmt_forecast(f: dict[str, Any]) -> str:
    """One of a job's forecasts and what happened, by whom: 'expected 00:27:39 to 00:32:32 UTC, started 00:26:50
    UTC (-49s) (scheduler)', '0.0998s, measured 0.106s (+0.0058s, 5.5%) (estimate)'."""
    predicted, actual, source = f.get("predicted"), f.get("actual"), f.get("source")
    if predicted is None:
        return f"{f.get('note') or 'cannot be known'} ({source})"
    start = f.get("kind") == "start_time"
    made = parse_time(f.get("made_at")) or datetime.now(UTC)

    def shown(v: float) -> str:
        return fmt_time(made + timedelta(seconds=v)) if start else fmt_amount(v, f.get("unit"))

    high = f.get("predicted_high")
    said = (
        ("expected " if start else "")
        + shown(predicted)
        + (f" to {shown(high)}" if high not in (None, predicted) else "")
    )
    if actual is None:
        return f"{said}, {'not measured yet' if f.get('settled_at') is None else 'never measured'} ({source})"
    error = fmt_amount(actual - predicted, f.get("unit"), signed=True)
    share = "" if start or not actual else f", {100 * abs(actual - predicted) / actual:.1f}%"
    return f"{said}, {'started' if start else 'measured'} {shown(actual)} ({error}{share}) ({source})"


def fmt_share(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"


def fmt_compile_hits(reuse: Any) -> str:
    """A team's compile-cache hits over its compiles: '11/12 (92%)'; '-' when nothing compiled."""
    if not isinstance(reuse, dict) or not reuse.get("compiled"):
        return "-"
    return f"{reuse.get('hits')}/{reuse['compiled']} ({100 * (reuse.get('hit_rate') or 0):.0f}%)"


def fmt_compile_saved(reuse: Any) -> str:
    """The compile time a team's cache hits saved; '-' when nothing compiled."""
    if not isinstance(reuse, dict) or not reuse.get("compiled"):
        return "-"
    return fmt_duration(reuse.get("saved_s"))


def fmt_placement(placement: Any) -> str:
    """[{host, gpus: [uuid], slots}] -> 'node1:2gpu, node2:4slots'."""
    if not placement:
        return "-"
    parts = []
    for p in placement:
        if not isinstance(p, dict):
            parts.append(str(p))
            continue
        gpus = p.get("gpus") or []
        what = f"{len(gpus)} GPU" if gpus else f"{p.get('slots', 0)} slot(s)"
        parts.append(f"{p.get('host', '?')}: {what}")
    return ", ".join(parts)


def fmt_quotas(quotas: Any) -> str:
    if not quotas:
        return "-"
    parts = []
    for q in quotas:
        text = f"{q.get('gpu_type')}={q.get('nominal')}"
        if q.get("borrowing_limit") is not None:
            text += f" (+{q['borrowing_limit']})"
        parts.append(text)
    return ", ".join(parts)


def render(data: Any, fmt: OutputFormat, make_table: Callable[[], Any]) -> None:
    if fmt is not OutputFormat.table:
        print_data(data, fmt)
    else:
        shown = make_table()
        console.print(text(shown) if isinstance(shown, str) else shown)


def kv_table(pairs: Iterable[tuple[str, Any]], *, title: str | None = None) -> Table:
    t = Table(title=title, show_header=False, box=None, pad_edge=False, title_justify="left", title_style="bold")
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column(overflow="fold")
    for key, value in pairs:
        t.add_row(text(key), value if isinstance(value, Text) else text(fmt_value(value)))
    return t
