"""A webhook receiver as a real process, for the e2e tests: ``python -m tests.support.webhook_receiver PORT LOG``.

It verifies each request as docs/notifications.md tells receivers to (``core.webhooks.verify``: a recent timestamp
and the HMAC of ``"<t>.<body>"`` under the hook's secret, read from ``KILN_TEST_WEBHOOK_SECRETS``: a JSON object of
path -> secret), answers 401 to a request that fails, 200 otherwise, and appends one JSON line per request to LOG:
path, verified, the Kiln-* headers and the body."""

from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from core.webhooks import SIGNATURE_HEADER, verify


def main() -> None:
    port, log_path = int(sys.argv[1]), sys.argv[2]
    secrets: dict[str, str] = json.loads(os.environ.get("KILN_TEST_WEBHOOK_SECRETS", "{}"))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            secret = secrets.get(self.path, "")
            ok = bool(secret) and verify(secret, self.headers.get(SIGNATURE_HEADER, ""), body, time.time())
            record = {
                "path": self.path,
                "verified": ok,
                "delivery": self.headers.get("Kiln-Delivery"),
                "event": self.headers.get("Kiln-Event"),
                "signature": self.headers.get(SIGNATURE_HEADER),
                "body": body.decode(errors="replace"),
            }
            with open(log_path, "a") as log:
                log.write(json.dumps(record) + "\n")
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
