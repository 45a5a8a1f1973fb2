"""``kiln checkpoint export``: a job's checkpoint as safetensors weights and a manifest, downloaded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli import output as out
from cli.app import OutputOpt, client, examples
from cli.errors import CliError, ExitCode
from cli.output import OutputFormat, console

checkpoint_app = typer.Typer(
    help="Checkpoints: export a job's weights (safetensors) for use outside kiln.",
    no_args_is_help=True,
    epilog=examples("kiln checkpoint export 42 -d ./weights"),
)

FILES = ("model.safetensors", "manifest.json")


@checkpoint_app.command(
    "export",
    epilog=examples("kiln checkpoint export 42 -d ./weights", "kiln checkpoint export 42 --step 200 --no-wait -o json"),
)
def export(
    job_id: int,
    step: Annotated[int | None, typer.Option("--step", help="The checkpoint's step (default: the latest).")] = None,
    output_dir: Annotated[Path, typer.Option("--output-dir", "-d", help="Where the files go.")] = Path("."),
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the export, then download it.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the conversion.")] = 600.0,
    output: OutputOpt = OutputFormat.table,
) -> None:
    """Export a job's checkpoint (the job's team only): a worker converts its weights to safetensors, then the
    files are downloaded as job<ID>-step<N>-model.safetensors and job<ID>-step<N>-manifest.json."""
    with client() as api:
        body: dict[str, Any] = {} if step is None else {"step": step}
        state = api.post(f"/v1/jobs/{job_id}/exports", json=body)
        if output is OutputFormat.table:
            console.print(f"export of job {job_id} at step {state['step']}: {state['state']}")
        deadline = time.monotonic() + timeout
        while wait and state["state"] in ("requested", "running"):
            if time.monotonic() > deadline:
                raise CliError(
                    f"the export is still {state['state']} after {timeout:.0f} s; run the command again "
                    "later (it resumes)",
                    ExitCode.FAILURE,
                )
            time.sleep(1.0)
            state = api.get(f"/v1/jobs/{job_id}/exports/{state['step']}")
        if state["state"] == "failed":
            raise CliError(f"the export failed: {state['error']}", ExitCode.FAILURE)
        if state["state"] == "ready":
            output_dir.mkdir(parents=True, exist_ok=True)
            for name in FILES:
                dest = output_dir / f"job{job_id}-step{state['step']}-{name}"
                size = api.download(f"/v1/jobs/{job_id}/exports/{state['step']}/{name}", dest)
                if output is OutputFormat.table:
                    console.print(out.text(f"  {dest} ({out.fmt_bytes(size)})"))
    if output is OutputFormat.json:
        out.print_json(state)
    elif state["state"] == "ready":
        console.print(f"sha256 {state['sha256']}")
