"""``python -m trainer --spec SPEC.json --run-dir DIR`` (under torchrun, one process per rank).

Exit codes are ``core.trainer_protocol.ExitCode``: 0 done, 2 bad spec or a mistake in the user's settings or
recipe, 75 preempted (checkpoint committed), 76 fenced, 77 too many loss spikes, 78 OOM, 79 NCCL error, 80 lease
expired; anything else is a crash.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from core.trainer_protocol import ExitCode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description=__doc__)
    parser.add_argument("--spec", required=True, type=pathlib.Path, help="JobSpec as JSON (or YAML)")
    parser.add_argument("--run-dir", required=True, type=pathlib.Path, help="telemetry and default checkpoints")
    args = parser.parse_args(argv)

    from core.spec import SpecError, parse_spec_text

    try:
        spec = parse_spec_text(args.spec.read_text())
    except (OSError, SpecError) as exc:
        print(f"kiln trainer: bad spec: {exc}", file=sys.stderr)
        return int(ExitCode.USER_ERROR)

    # The context and cuBLAS load while the rest imports (trainer/early_cuda.py); not for a deterministic job, whose
    # cuBLAS workspace setting must come before the first GEMM (trainer/determinism.py).
    if spec.resources.gpus and not spec.deterministic:
        from trainer import early_cuda

        early_cuda.start()
    from trainer import compile_preload
    from trainer.builders import compile_cache_dir, persist_compiler_caches
    from trainer.parallel import init_distributed, shutdown
    from trainer.run import run

    args.run_dir.mkdir(parents=True, exist_ok=True)
    if spec.compile.mode != "off":  # torch's compiler loads while the ranks meet and the model is built
        cache = compile_cache_dir(args.run_dir)
        persist_compiler_caches(cache)  # Inductor's and Triton's cache dirs are set before any of it loads
        compile_preload.start(cache)
    env = init_distributed()
    try:
        return int(run(spec, args.run_dir, env))  # a mistake in the settings or recipe: USER_ERROR, with its line
    finally:
        shutdown(env)


if __name__ == "__main__":
    sys.exit(main())
