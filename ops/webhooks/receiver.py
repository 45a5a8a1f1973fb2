"""A webhook receiver that verifies kiln's signature, in the standard library only: a starting point for your own.

    KILN_WEBHOOK_SECRET=whsec_... python ops/webhooks/receiver.py 8600

kiln signs each delivery with the hook's secret (shown once, when the hook is created):

    Kiln-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">

A receiver recomputes the MAC over the raw body as received (before parsing it), compares in constant time, and
refuses a timestamp more than 5 minutes from its own clock (a replayed request). ``Kiln-Delivery`` is the
delivery's id: kiln delivers at least once, so a receiver that must act once keeps the ids it has seen.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

TOLERANCE_S = 300


def verify(secret: str, header: str, body: bytes, now: float) -> bool:
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    if not parts.get("t", "").isdigit() or abs(now - int(parts["t"])) > TOLERANCE_S:
        return False
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ok = verify(os.environ["KILN_WEBHOOK_SECRET"], self.headers.get("Kiln-Signature", ""), body, time.time())
        self.send_response(204 if ok else 401)
        self.end_headers()
        if not ok:
            print("refused: bad or stale signature", flush=True)
            return
        event = json.loads(body)
        job = event.get("job") or {}
        if job.get("id"):
            subject = f"job {job['id']} ({job.get('name')}, {job.get('state')})"
        else:  # a test delivery of a team's hook
            subject = f"team {job.get('team')}"
        print(
            f"delivery {self.headers.get('Kiln-Delivery')}: {event.get('kind')} {subject}: {event['event']['message']}",
            flush=True,
        )

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    HTTPServer(("127.0.0.1", int(sys.argv[1] if len(sys.argv) > 1 else 8600)), Receiver).serve_forever()
