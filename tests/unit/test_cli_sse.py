"""The server-sent-events parser used by `kiln logs`."""

from __future__ import annotations

from cli.client import parse_sse
from cli.follow import END_EVENTS, log_line


def test_log_lines_and_end_event() -> None:
    stream = [
        "event: log\n",
        "id: 12\n",
        "data: step 1 loss 4.1\n",
        "\n",
        ": keep-alive comment\n",
        "event: log\n",
        "data: [rank 0] {'loss': 3.9}\n",
        "\n",
        "event: end\n",
        'data: {"state": "SUCCEEDED", "attempt": 1}\n',
        "\n",
    ]
    events = list(parse_sse(stream))
    assert [e.event for e in events] == ["log", "log", "end"]
    assert events[0].id == "12" and events[1].id == "12"  # the last id persists, as in the spec
    assert [log_line(e) for e in events] == ["step 1 loss 4.1", "[rank 0] {'loss': 3.9}", None]
    assert events[2].event in END_EVENTS
    assert events[2].json() == {"state": "SUCCEEDED", "attempt": 1}


def test_multiline_data_crlf_and_no_space_after_colon() -> None:
    events = list(parse_sse(["data:first\r\n", "data: second\r\n", "\r\n"]))
    assert len(events) == 1
    assert events[0].event == "message"
    assert events[0].data == "first\nsecond"
    assert log_line(events[0]) == "first\nsecond"


def test_trailing_event_without_blank_line_is_kept_and_retry_is_read() -> None:
    events = list(parse_sse(["retry: 500\n", "data: tail"]))
    assert events[0].data == "tail"
    assert events[0].retry == 500


def test_empty_data_line_keeps_a_blank_log_line() -> None:
    events = list(parse_sse(["event: log\n", "data: \n", "\n"]))
    assert [log_line(e) for e in events] == [""]
