"""docs/configuration.md from the settings tree, so the page cannot drift from the code.

``python -m core.settings_doc`` rewrites the page; tests/unit/test_settings_doc.py fails when it is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from core.policy_config import PolicyConfig
from core.settings import (
    ApiLimits,
    ConnectionSettings,
    DashboardSettings,
    MetricsSettings,
    NotificationSettings,
    OidcSettings,
    RetentionSettings,
    Timings,
    UserCodeSettings,
    WorkerHost,
)

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"

INTRO = """\
# Configuration

The API, the scheduler and the worker read their settings from one typed tree (`core/settings.py`), from the
environment, once at start-up, and pass the parts down (`kiln up` passes its environment to all three). A setting is
`KILN_<FIELD>` in upper case (`KILN_LEASE_S=60`); the scheduling policy is a nested group, `KILN_POLICY__<FIELD>`
(`KILN_POLICY__PREEMPTION=false`, `KILN_POLICY__PLACEMENT=spread`). A value the type refuses stops the process at
start-up with the setting's name. Lists are comma-separated, mappings JSON, an empty value of an optional setting
means its default behaviour as stated.

The live scheduler loop and `kiln simulate` (its `kiln` policy; the `fifo` baseline is fixed) take the policy from
here.

This page is generated from the code (`python -m core.settings_doc`); a test fails when it is stale.
"""

GROUPS: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("Connections and storage", "KILN_", ConnectionSettings),
    ("API limits", "KILN_", ApiLimits),
    ("Timings", "KILN_", Timings),
    ("Worker host", "KILN_", WorkerHost),
    ("A team's own code", "KILN_", UserCodeSettings),
    ("Dashboard", "KILN_", DashboardSettings),
    ("Notifications", "KILN_", NotificationSettings),
    ("Process metrics", "KILN_", MetricsSettings),
    ("Retention", "KILN_", RetentionSettings),
    ("Sign-in with OpenID Connect", "KILN_", OidcSettings),
    ("Scheduling policy", "KILN_POLICY__", PolicyConfig),
)


# Defaults computed on the machine the process runs on: the page states them in words.
MACHINE_DEPENDENT = frozenset({"home", "local_tier_dir"})


def _default(name: str, field: FieldInfo) -> str:
    if name in MACHINE_DEPENDENT:
        return "see meaning"
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None or value == "" or value == [] or value == {}:
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"


def _own_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    own = model.__dict__.get("__annotations__", {})
    return {name: f for name, f in model.model_fields.items() if name in own}


def render() -> str:
    parts = [INTRO]
    for title, prefix, model in GROUPS:
        parts.append(f"\n## {title}\n\n{(model.__doc__ or '').strip()}\n\n")
        parts.append("| variable | default | meaning |\n|---|---|---|\n")
        for name, field in _own_fields(model).items():
            description = (field.description or "").replace("|", "\\|")
            parts.append(f"| `{prefix}{name.upper()}` | {_default(name, field)} | {description} |\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    PAGE.write_text(render())
    print(f"wrote {PAGE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
