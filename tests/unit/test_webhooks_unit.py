"""Webhooks without services: which events notify, the bodies, the signature, and the example receiver in ops/
(standard library only, for users to copy) agreeing with what kiln signs."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from core.models import Event
from core.webhooks import body_bytes, kind_of, sign, verify

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("type_", "data", "job_id", "kind"),
    [
        ("SUCCEEDED", {}, 1, "finished"),
        ("FAILED", {}, 1, "failed"),
        ("CANCELLED", {}, 1, "cancelled"),
        ("PREEMPTING", {}, 1, "preempted"),
        ("QUEUED", {"from": "LOST"}, 1, "restarted"),
        ("QUEUED", {"from": "RUNNING"}, 1, None),  # a preempted job back in the queue is not a restart
        ("SLA_DEADLINE_VIOLATION", {}, 1, "sla_violation"),
        ("CHECKPOINT", {}, 1, None),
        ("SUCCEEDED", {}, None, None),  # no job: an audit event
    ],
)
def test_which_events_notify(type_: str, data: dict[str, str], job_id: int | None, kind: str | None) -> None:
    assert kind_of(Event(type=type_, data=data, job_id=job_id)) == kind


def test_bodies() -> None:
    payload = {"kind": "failed", "event": {"message": "OOM"}, "job": {"id": 7, "name": "gpt", "team": "vision"}}
    assert json.loads(body_bytes("json", 3, payload)) == {"id": 3, **payload}
    assert json.loads(body_bytes("slack", 3, payload)) == {"text": "kiln: job 7 (gpt, team vision) failed: OOM"}


def test_signature() -> None:
    body, now = b'{"id":1}', time.time()
    header = sign("s", int(now), body)
    assert header.startswith(f"t={int(now)},v1=") and verify("s", header, body, now)
    assert not verify("s", header, body, now + 301) and not verify("s", "v1=abc", body, now)


def test_the_example_receiver_verifies_as_kiln_signs() -> None:
    """ops/webhooks/receiver.py (standard library only, for users to copy) agrees with core.webhooks."""
    spec = importlib.util.spec_from_file_location("receiver", ROOT / "ops" / "webhooks" / "receiver.py")
    assert spec is not None and spec.loader is not None
    receiver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(receiver)
    body, now = b'{"kind":"finished"}', time.time()
    assert receiver.verify("whsec_x", sign("whsec_x", int(now), body), body, now)
    assert not receiver.verify("whsec_x", sign("whsec_x", int(now), body), body + b" ", now)  # tampered
    assert not receiver.verify("whsec_y", sign("whsec_x", int(now), body), body, now)  # another secret
    assert not receiver.verify("whsec_x", sign("whsec_x", int(now) - 600, body), body, now)  # replayed
