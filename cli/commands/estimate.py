"""``kiln estimate FILE``: what the job would need, take and cost per option, before it is submitted."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli.app import OutputOpt, app, client, examples
from cli.commands.job_input import read_spec_file
from cli.output import OutputFormat

MARKS = {"written": "=", "recommended": "*"}


@app.command(epilog=examples("kiln estimate examples/gpt-tiny.yaml", "kiln estimate job.yaml --all -o json"))
def estimate(
    file: Annotated[str, typer.Argument(help="Job spec, YAML or JSON ('-' reads stdin).", metavar="FILE")],
    all_options: Annotated[
        bool, typer.Option("--all", "-a", help="Every option, not only the job as written and the 10 cheapest.")
    ] = False,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Predicted peak memory, step time, GPU-hours and cost of the job as written and of each option kiln could
    run it in (GPU type and count, DDP or FSDP2, compiled or eager, a GPU share), from kiln's measured runs of the
    same recipe; and the cheapest that fits and meets the spec's deadline. Nothing is submitted."""
    from cli import output as out

    text = read_spec_file(file)
    with client() as api:
        answer = api.post("/v1/estimates", content=text.encode(), headers={"Content-Type": "application/yaml"})
    out.render(answer, output, lambda: _report(answer, all_options))


def _report(answer: dict[str, Any], all_options: bool) -> Any:
    from rich.console import Group

    from cli import output as out

    options = answer["options"]
    best = answer.get("recommended")
    shown = list(range(len(options))) if all_options else _shown(options, best)
    rows = [{**options[i], "mark": _mark(i, best)} for i in shown]
    deadline = f"deadline {out.fmt_time(answer['deadline'])}" if answer.get("deadline") else "no deadline"
    head = f"{answer['name']}: {answer['shape']}, {answer['steps']} steps, {deadline}"
    columns: list[out.Column] = [
        ("", lambda r: r["mark"]),
        ("OPTION", lambda r: r["description"]),
        ("CHANGES", lambda r: _changes(r["changes"])),
        ("MEMORY/GPU", _memory),
        ("STEP (p10-p90)", _step),
        ("BASIS", lambda r: (r["step_time"] or {}).get("label", "no history")),
        ("RUN", lambda r: out.fmt_duration(r["hours"] * 3600) if r["hours"] is not None else "-"),
        ("SLOT-H" if all(r["gpu_type"] == "cpu" for r in rows) else "GPU-H", _range),
        ("COST", lambda r: f"{r['cost']:.3g} {answer['currency']}" if r["cost"] is not None else "-"),
        ("DEADLINE", lambda r: {True: "meets", False: "misses", None: "-"}[r["meets_deadline"]]),
    ]
    legend = f"= as written   * recommended   ({len(shown)} of {len(options)} options; --all for every one)"
    lines: list[Any] = [
        out.text(head, "bold"),
        out.table(columns, rows),
        out.text(legend, "dim"),
        out.text(answer["summary"]),
    ]
    if answer.get("queue"):
        lines.append(out.text(answer["queue"]["sentence"]))
    lines += [out.text(f"note: {n}", "dim") for n in answer["notes"]]
    return Group(*lines)


def _shown(options: list[dict[str, Any]], best: int | None, cheapest: int = 10) -> list[int]:
    """The job as written, the recommended option, then the cheapest others (the answer orders them by cost)."""
    picked = [0] + ([best] if best else [])
    picked += [i for i in range(1, len(options)) if i != best][:cheapest]
    return sorted(set(picked), key=picked.index)


def _mark(i: int, best: int | None) -> Any:
    from cli.output import text

    return text((MARKS["written"] if i == 0 else "") + (MARKS["recommended"] if i == best else ""), "bold")


def _changes(changes: dict[str, Any]) -> str:
    if not changes:
        return "-"
    return ", ".join(
        f"{k.removeprefix('recipe.hyperparameters.')}={'(none)' if v is None else v}" for k, v in changes.items()
    )


def _memory(r: dict[str, Any]) -> str:
    from cli.output import fmt_bytes

    peak = r["peak_memory_bytes"]
    if peak is None:
        return "-"
    fits = {True: "fits", False: "DOES NOT FIT", None: "?"}[r["fits"]]
    room = f" of {fmt_bytes(r['gpu_memory_bytes'])}" if r["gpu_memory_bytes"] else ""
    return f"{fmt_bytes(peak)}{room} {fits}"


def _step(r: dict[str, Any]) -> str:
    s = r["step_time"]
    if s is None:
        return "-"
    return f"{_seconds(s['median_s'])} ({_seconds(s['low_s'])}-{_seconds(s['high_s'])})"


def _seconds(s: float) -> str:
    return f"{s * 1000:.3g}ms" if s < 1 else f"{s:.3g}s"


def _range(r: dict[str, Any]) -> str:
    if r["gpu_hours"] is None:
        return "-"
    return f"{r['gpu_hours']:.3g} ({r['gpu_hours_low']:.3g}-{r['gpu_hours_high']:.3g})"
