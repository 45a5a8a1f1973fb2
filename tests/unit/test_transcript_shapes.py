"""The docs' transcripts compared by shape (tests/e2e/transcripts.py): what one run to the next changes is let go
(times, durations, ids, numbers, paths, tokens, the host's name, column widths), what the docs promise is not."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.transcripts import blocks, disagreement, matches, normalise

DOCS = [
    "2026-12-01 08:38:57 UTC SUCCEEDED: finished at step 60",
    "job 1 SUCCEEDED final loss 2.8722",
    "  gpt-tiny SUCCEEDED ━━━━ 60/60 loss 2.8722 0:00:24",
    " 1  gpt-tiny  default  admin  silver  SUCCEEDED     0  60/60  2.8722  22s   25s ago    -",
    "[kiln up] api       pid 16668   log /tmp/fresh/.kiln/logs/api.log",
    "[kiln up] dashboard sign-in token (also in the CLI config): kiln_…",
    "  40  5.1 MiB  yes       f674e2115a04  2026-11-29 09:02:11 UTC  /tmp/kiln-demo/.kiln/storage/ckpt/1/step_40",
    "forecast: start time   expected 2026-12-07 00:27:33 UTC, started 2026-12-07 00:26:53 UTC (-40.8s) (scheduler)",
]
RUN = [
    "2026-12-07 01:33:29 UTC SUCCEEDED: finished at step 60",
    "job 12 SUCCEEDED final loss 2.8723",
    "  gpt-tiny SUCCEEDED ━━━━ 60/60 loss 2.8723 0:00:06",
    "12  gpt-tiny  default  admin  silver  SUCCEEDED     0  60/60  2.8723  1m04s  2m ago    -",
    "[kiln up] api       pid 28422   log /tmp/pytest-of-root/p-1/s3/.kiln/logs/api.log",
    "[kiln up] dashboard sign-in token (also in the CLI config): kiln_7ORf68tiDIxu97nKfDOPE-xGtV73vDgjVk7w3XU",
    "  40  5.3 MiB  yes       d8e44cb93f6a  2026-12-07 01:36:47 UTC  /tmp/ketqu08fh/.kiln/storage/ckpt/1/step_40",
    "forecast: start time   expected 2026-12-07 01:36:42 UTC, started 2026-12-07 01:36:42 UTC (+0.18s) (scheduler)",
]


def test_what_changes_from_run_to_run_is_let_go() -> None:
    assert disagreement("x", "cmd", DOCS, RUN) is None
    assert normalise("admitted on box7", host="box7") == normalise("admitted on vm")


def test_a_changed_phrase_a_missing_line_or_another_state_is_caught() -> None:
    for i, changed in [(1, "job 12 SUCCEEDED, final loss 2.8723"), (0, "2026-12-07 01:33:29 UTC FAILED: step 60")]:
        run = [*RUN[:i], changed, *RUN[i + 1 :]]
        problem = disagreement("README.md:50", "./kiln submit", DOCS, run)
        assert problem is not None and changed.split()[-3] in problem
    assert disagreement("x", "cmd", DOCS, RUN[:-1]) is not None
    assert disagreement("x", "cmd", DOCS, [*RUN, "a line the docs do not show"]) is not None


def test_an_ellipsis_stands_for_lines_left_out() -> None:
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"]) and matches(["a", "...", "d"], ["a", "d"])
    assert not matches(["a", "...", "d"], ["a", "b"])


def test_directives_above_a_fence_steer_the_run(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# t\n\n<!-- transcript: skip: needs a GPU -->\n```text\n$ ./kiln hosts --gpus\nX\n```\n\n"
        "<!-- transcript: fresh -->\n<!-- transcript: before: ./kiln submit a.yaml -->\n"
        "```text\n$ ./kiln cancel 1\nerror: conflict\n(exit 8)\n$ ./kiln up\nbanner\n^C\nstopped\n```\n"
        "```text\nno command here\n```\n"
    )
    skipped, run = blocks(doc, tmp_path)
    assert skipped.skip == "needs a GPU" and skipped.source == "doc.md:4"
    assert run.fresh and run.before == ["./kiln submit a.yaml"] and run.skip is None
    cancel, up = run.commands
    assert (cancel.line, cancel.shown, cancel.exit_code) == ("./kiln cancel 1", ["error: conflict"], 8)
    assert (up.shown, up.after_interrupt) == (["banner"], ["stopped"])
