"""Formatting helpers behind the tables."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rich.console import Console

from cli import output as out
from cli.follow import describe_transition, exit_code_for_state


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (3.4, "3s"), (59.6, "1m00s"), (75, "1m15s"), (3700, "1h01m"), (90000, "1d01h")],
)
def test_fmt_duration(seconds: float | None, text: str) -> None:
    assert out.fmt_duration(seconds) == text


def test_times_are_shown_in_utc_whatever_the_offset() -> None:
    assert out.fmt_time("2026-11-29T10:30:00+01:00") == "2026-11-29 09:30:00 UTC"
    assert out.fmt_time("2026-11-29T09:30:00.123456Z") == "2026-11-29 09:30:00 UTC"
    assert out.fmt_time(None) == "-"
    assert out.fmt_time("not a time") == "-"


def test_age() -> None:
    now = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert out.fmt_age("2026-11-29T09:58:30Z", now) == "1m30s ago"


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "-"), (512, "512 B"), (2048, "2.0 KiB"), (8 * 1024**3, "8.0 GiB"), (3 * 1024**5, "3072.0 TiB")],
)
def test_fmt_bytes(n: int | None, text: str) -> None:
    assert out.fmt_bytes(n) == text


def test_rate_is_decimal_gb_per_s() -> None:
    assert out.fmt_rate(32_000_000_000) == "32 GB/s"
    assert out.fmt_rate(None) == "-"


JOB = {
    "id": 7,
    "name": "gpt-tiny",
    "team": "default",
    "user": "admin",
    "qos": "silver",
    "state": "QUEUED",
    "gpus": 0,
    "last_step": 20,
    "steps": 60,
    "last_loss": 2.345678,
    "pending_reason": "QUOTA",
    "pending_message": "team default: 4/4 cpu slots in use",
    "submitted_at": "2026-11-29T09:00:00Z",
    "started_at": None,
    "finished_at": None,
    "exit_reason": None,
}


def test_job_progress_note_and_time() -> None:
    now = datetime(2026, 11, 29, 9, 2, tzinfo=UTC)
    assert out.job_progress(JOB) == "20/60"
    assert out.job_note(JOB) == "QUOTA"
    assert out.job_wait_or_runtime(JOB, now) == "2m00s"
    done = JOB | {
        "state": "FAILED",
        "exit_reason": "loss spike",
        "started_at": "2026-11-29T09:01:00Z",
        "finished_at": "2026-11-29T09:01:30Z",
    }
    assert out.job_note(done) == "loss spike"
    assert out.job_wait_or_runtime(done, now) == "30s"


def test_time_in_the_queue_counts_every_wait() -> None:
    now = datetime(2026, 11, 29, 9, 2, tzinfo=UTC)
    requeued = JOB | {"queued_s": 90.0, "waiting_since": "2026-11-29T09:01:00Z"}  # 90 s before, 60 s in this wait
    assert out.job_queued(requeued, now) == "2m30s so far"
    assert out.job_queued(JOB | {"state": "RUNNING", "queued_s": 90.0, "waiting_since": None}, now) == "1m30s"
    assert out.job_queued(JOB, now) == "-"  # an older API sends no queued_s
    assert out.job_wait_or_runtime(requeued | {"started_at": "2026-11-29T08:00:00Z"}, now) == "1m00s"  # this wait


def test_job_table_renders_every_column() -> None:
    console = Console(width=200, record=True)
    console.print(out.table(out.JOB_COLUMNS, [JOB]))
    text = console.export_text()
    for header, _ in out.JOB_COLUMNS:
        assert header in text
    assert "gpt-tiny" in text and "20/60" in text and "2.3457" in text and "QUOTA" in text


def test_a_fractional_job_shows_its_share_of_one_gpu() -> None:
    assert out.job_gpus(JOB | {"gpus": 2}) == 2
    shared = JOB | {"gpus": 1, "spec": {"resources": {"gpus": 1, "gpu_share": {"memory_gb": 40, "sm_percent": 50}}}}
    assert out.job_gpus(shared) == "share 40G/50%"
    from_class = JOB | {"spec": {"resources": {"gpu_share": {"memory_gb": 20.5, "sm_percent": None}}}}
    assert out.job_gpus(from_class) == "share 20.5G/class"


def test_placement_and_quotas() -> None:
    placement = [{"host": "n1", "gpus": ["a", "b"], "slots": 0}, {"host": "n2", "gpus": [], "slots": 2}]
    assert out.fmt_placement(placement) == "n1: 2 GPU, n2: 2 slot(s)"
    assert out.fmt_placement([]) == "-"
    quotas = [
        {"gpu_type": "cpu", "nominal": 4, "borrowing_limit": None},
        {"gpu_type": "H200", "nominal": 8, "borrowing_limit": 2},
    ]
    assert out.fmt_quotas(quotas) == "cpu=4, H200=8 (+2)"


def test_follow_exit_codes_and_summary() -> None:
    assert exit_code_for_state("SUCCEEDED") == 0
    assert exit_code_for_state("FAILED") == 1
    assert exit_code_for_state("CANCELLED") == 1
    line = describe_transition({"id": 3, "state": "SUCCEEDED", "last_loss": 1.5})
    assert line == "job 3 SUCCEEDED final loss 1.5000"
    assert "(QUOTA: full)" in describe_transition(
        {"id": 3, "state": "QUEUED", "pending_reason": "QUOTA", "pending_message": "full"}
    )
