"""Every response carries the security headers, and ``/docs`` works offline: its scripts come from kiln itself.

Before: no Content-Security-Policy (nor frame-ancestors), no ``X-Content-Type-Options``, no ``Referrer-Policy``;
``/docs`` loaded Swagger UI's scripts from a CDN on the dashboard's origin, where the token lives."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from harness.dashboard import chromium
from tests.security.live import Live

pytestmark = pytest.mark.e2e


def test_every_response_carries_the_headers(live: Live) -> None:
    with httpx.Client(base_url=live.kiln.url, timeout=30) as http:
        for path, headers in (
            ("/", {}),
            ("/docs", {}),
            ("/openapi.json", {}),
            ("/v1/me", live.headers()),
            ("/v1/me", {}),
            ("/ui/js/app.js", {}),
            ("/nowhere", {}),
        ):
            r = http.get(path, headers=headers)
            assert r.headers.get("x-content-type-options") == "nosniff", path
            assert r.headers.get("referrer-policy") == "no-referrer", path
            csp = r.headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp, (path, csp)


def test_docs_work_offline_under_the_policy(live: Live) -> None:
    page_html = httpx.get(f"{live.kiln.url}/docs", timeout=30).text
    sources = re.findall(r'(?:src|href)="([^"]+)"', page_html)
    assert sources and all(s.startswith("/") or s.startswith("data:") for s in sources), sources
    with chromium() as browser:
        b: Any = browser
        page = b.new_page()
        outside: list[str] = []
        errors: list[str] = []
        page.on("request", lambda r: outside.append(r.url) if not r.url.startswith((live.kiln.url, "data:")) else None)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{live.kiln.url}/docs")
        page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
        assert "kiln" in page.inner_text(".swagger-ui .info .title")
        page.wait_for_selector("#operations-jobs-submit_v1_jobs_post, .opblock-tag", timeout=30_000)
        page.close()
    assert outside == [] and errors == [], (outside, errors)
