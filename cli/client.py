"""A small synchronous client for the kiln REST API (httpx), with errors mapped to :class:`CliError`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.config import CliConfig
from cli.errors import CliError, ExitCode, error_for_status, unreachable

if TYPE_CHECKING:  # httpx costs ~150 ms to import; only commands that talk to the API pay for it
    import httpx

USER_AGENT = "kiln-cli/0.1"
RESUME_FOR_S = 60.0  # how long a broken stream is tried again before the command gives up


@dataclass
class SseEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class _SseBuffer:
    event: str = ""
    data: list[str] = field(default_factory=list)
    id: str | None = None
    retry: int | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """Parse a text/event-stream (WHATWG rules): ``field: value`` lines, a blank line dispatches, ``:`` comments."""
    buf = _SseBuffer()
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if buf.data or buf.event:
                yield SseEvent(buf.event or "message", "\n".join(buf.data), buf.id, buf.retry)
            buf = _SseBuffer(id=buf.id)
            continue
        if line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            buf.data.append(value)
        elif name == "event":
            buf.event = value
        elif name == "id":
            buf.id = value
        elif name == "retry" and value.isdigit():
            buf.retry = int(value)
    if buf.data:
        yield SseEvent(buf.event or "message", "\n".join(buf.data), buf.id, buf.retry)


class KilnClient:
    def __init__(self, config: CliConfig, *, timeout: float = 30.0):
        import httpx

        self.config = config
        self.base_url = config.api_url
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json, application/problem+json"}
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KilnClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        import httpx

        try:
            return self._http.request(method, path, **kwargs)
        except httpx.ConnectError as exc:
            raise unreachable(self.base_url, _reason(exc)) from None
        except httpx.TimeoutException:
            raise CliError(f"the kiln API at {self.base_url} did not answer in time", ExitCode.UNREACHABLE) from None
        except httpx.TransportError as exc:
            raise unreachable(self.base_url, _reason(exc)) from None

    def _check(self, resp: httpx.Response) -> None:
        if resp.is_success:
            return
        try:
            body: Any = resp.json()
        except ValueError:
            body = resp.text
        raise error_for_status(
            resp.status_code,
            body,
            url=str(resp.request.url.copy_with(query=None)),
            method=resp.request.method,
            retry_after=resp.headers.get("Retry-After"),
            token_present=bool(self.config.token),
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._send(method, path, **kwargs)
        self._check(resp)
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text

    def get(self, path: str, params: Any = None) -> Any:
        return self.request("GET", path, params=params)

    def get_versioned(self, path: str) -> tuple[Any, str | None]:
        """A representation and its ETag, to send back as ``If-Match`` with a change of it."""
        resp = self._send("GET", path)
        self._check(resp)
        return resp.json(), resp.headers.get("ETag")

    def download(self, path: str, dest: Path) -> int:
        """Stream a file from the API to ``dest`` (written under a temporary name, then renamed); its size."""
        import httpx

        tmp = dest.with_name(f".{dest.name}.part")
        size = 0
        try:
            with self._http.stream("GET", path) as resp:
                if not resp.is_success:
                    resp.read()
                    self._check(resp)
                with open(tmp, "wb") as f:
                    for chunk in resp.iter_bytes(1 << 20):
                        f.write(chunk)
                        size += len(chunk)
        except httpx.TransportError as exc:
            tmp.unlink(missing_ok=True)
            raise unreachable(self.base_url, _reason(exc)) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(dest)
        return size

    def post(self, path: str, json: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", path, json=json, **kwargs)

    def put(self, path: str, json: Any = None) -> Any:
        return self.request("PUT", path, json=json)

    def patch(self, path: str, json: Any = None, *, if_match: str | None = None) -> Any:
        return self.request("PATCH", path, json=json, headers={"If-Match": if_match} if if_match else None)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def paginate(self, path: str, params: dict[str, Any], *, limit: int | None, page_size: int = 100) -> Iterator[Any]:
        """Follow ``next_cursor`` until ``limit`` items (None = all) have been yielded."""
        seen = 0
        cursor: str | None = None
        while True:
            want = page_size if limit is None else min(page_size, limit - seen)
            if want <= 0:
                return
            query = {**params, "limit": want}
            if cursor:
                query["cursor"] = cursor
            page = self.get(path, params=query)
            items = page.get("items", []) if isinstance(page, dict) else page
            for item in items:
                yield item
                seen += 1
                if limit is not None and seen >= limit:
                    return
            cursor = page.get("next_cursor") if isinstance(page, dict) else None
            if not cursor or not items:
                return

    def stream_sse(
        self, path: str, params: Any = None, *, read_timeout: float | None = None, resume_for_s: float = RESUME_FOR_S
    ) -> Iterator[SseEvent]:
        """Yield server-sent events until the server ends the stream. A connection that breaks is opened again
        with ``Last-Event-ID`` (the last event id seen), so the stream goes on right after the last event: for
        up to ``resume_for_s`` of trying before giving up."""
        import httpx

        timeout = httpx.Timeout(10.0, read=read_timeout)
        last_id: str | None = None
        broke_at: float | None = None
        delay = 0.5
        while True:
            headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_id} if last_id else {})}
            try:
                with self._http.stream("GET", path, params=params, headers=headers, timeout=timeout) as resp:
                    if not resp.is_success:
                        resp.read()
                        self._check(resp)
                    broke_at, delay = None, 0.5
                    for event in parse_sse(resp.iter_lines()):
                        last_id = event.id or last_id
                        yield event
                return
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if last_id is None and isinstance(exc, httpx.ConnectError):
                    raise unreachable(self.base_url, _reason(exc)) from None
                broke_at = broke_at or time.monotonic()
                if time.monotonic() - broke_at > resume_for_s:
                    raise CliError(
                        f"the stream from {self.base_url} broke and did not come back in {resume_for_s:.0f} s",
                        ExitCode.UNREACHABLE,
                    ) from None
            except httpx.TimeoutException:
                raise CliError(f"the log stream from {self.base_url} stalled", ExitCode.UNREACHABLE) from None
            time.sleep(delay)
            delay = min(5.0, delay * 2)


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.split("] ", 1)[-1][:200]
