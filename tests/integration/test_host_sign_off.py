"""A worker that leaves signs its host off: the host is DOWN at once, not after the heartbeat's staleness window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.db import utcnow
from core.models import Event, Host
from core.settings import Settings
from core.states import HostState
from workers.host_agent import HostAgent
from workers.inventory import NoGpus

pytestmark = pytest.mark.integration

SETTINGS = Settings(lease_s=10.0, heartbeat_interval_s=1.0)


def _agent(name: str) -> HostAgent:
    return HostAgent(name=name, inventory=NoGpus(), cpu_slots=2, address="127.0.0.1", settings=SETTINGS)


def _host(db: Session, name: str) -> Host:
    host = db.scalars(select(Host).where(Host.name == name)).one()
    db.refresh(host)
    return host


def test_a_leaving_worker_takes_its_host_down_and_the_next_one_brings_it_up(db: Session) -> None:
    agent = _agent("signoff-a")
    agent.register(db)
    db.flush()
    agent.sign_off(db)
    db.flush()
    assert _host(db, "signoff-a").state == HostState.DOWN
    down = db.scalars(select(Event).where(Event.type == "HOST_DOWN").order_by(Event.id.desc())).first()
    assert down is not None and down.data["host"] == "signoff-a" and down.data["signed_off"] is True
    _agent("signoff-a").heartbeat(db)  # the next worker on the host
    db.flush()
    assert _host(db, "signoff-a").state == HostState.UP


def test_an_excluded_host_stays_excluded_when_its_worker_leaves(db: Session) -> None:
    agent = _agent("signoff-b")
    host = agent.register(db)
    host.state = HostState.EXCLUDED.value
    host.excluded_until = utcnow() + timedelta(hours=1)
    db.flush()
    agent.sign_off(db)
    db.flush()
    assert _host(db, "signoff-b").state == HostState.EXCLUDED
