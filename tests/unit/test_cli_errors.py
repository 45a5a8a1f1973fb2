"""Error mapping: every HTTP failure becomes one message and a distinct exit code."""

from __future__ import annotations

import pytest

from cli.errors import ExitCode, error_for_status, field_errors

PROBLEM_422 = {
    "type": "https://kiln.dev/problems/validation-error",
    "title": "Request validation failed",
    "status": 422,
    "detail": "resources.gpus: Input should be greater than or equal to 0",
    "errors": [
        {"loc": "resources.gpus", "msg": "Input should be greater than or equal to 0", "type": "greater_than_equal"},
        {"loc": "sla.qos", "msg": "unknown QoS class 'platinum'", "type": "value_error"},
    ],
}


@pytest.mark.parametrize(
    ("status", "code", "word"),
    [
        (401, ExitCode.UNAUTHORIZED, "unauthorized"),
        (403, ExitCode.FORBIDDEN, "forbidden"),
        (404, ExitCode.NOT_FOUND, "not found"),
        (409, ExitCode.CONFLICT, "conflict"),
        (400, ExitCode.INVALID, "invalid"),
        (413, ExitCode.INVALID, "invalid"),
        (415, ExitCode.INVALID, "invalid"),
        (422, ExitCode.INVALID, "invalid"),
        (429, ExitCode.RATE_LIMITED, "rate limited"),
        (500, ExitCode.SERVER, "server error 500"),
        (503, ExitCode.SERVER, "server error 503"),
        (418, ExitCode.FAILURE, "HTTP 418"),
    ],
)
def test_status_maps_to_distinct_exit_code(status: int, code: ExitCode, word: str) -> None:
    err = error_for_status(status, {"title": "t", "status": status, "detail": "the detail"}, url="http://x/v1/jobs")
    assert err.code is code
    assert word in err.message
    assert "the detail" in err.message


def test_exit_codes_are_distinct() -> None:
    values = [c.value for c in ExitCode]
    assert len(values) == len(set(values))


def test_validation_problem_lists_every_field_path() -> None:
    err = error_for_status(422, PROBLEM_422, url="http://x/v1/jobs", method="POST")
    assert err.details == [
        "resources.gpus: Input should be greater than or equal to 0",
        "sla.qos: unknown QoS class 'platinum'",
    ]


def test_fastapi_default_422_shape_is_understood() -> None:
    body = {"detail": [{"loc": ["body", "resources", "gpus"], "msg": "too small", "type": "x"}]}
    err = error_for_status(422, body, url="u")
    assert err.code is ExitCode.INVALID
    assert err.details == ["resources.gpus: too small"]


def test_401_hint_depends_on_whether_a_token_was_sent() -> None:
    without = error_for_status(401, {"detail": "missing bearer token"}, url="u", token_present=False)
    with_token = error_for_status(401, {"detail": "unknown token"}, url="u", token_present=True)
    assert "kiln login" in without.message and "no API token" in without.message
    assert "refused" in with_token.message


def test_429_says_when_to_retry() -> None:
    err = error_for_status(429, {"detail": "slow down"}, url="u", retry_after="7")
    assert "retry after 7s" in err.message


def test_non_json_body_and_huge_detail_are_bounded() -> None:
    err = error_for_status(502, "<html>" + "x" * 5000, url="u")
    assert err.code is ExitCode.SERVER
    assert len(err.message) < 600


def test_404_without_detail_names_the_request() -> None:
    err = error_for_status(404, {}, url="http://h/v1/jobs/9", method="GET")
    assert "GET http://h/v1/jobs/9" in err.message


def test_field_errors_accepts_mapping_and_pointer_shapes() -> None:
    assert field_errors({"name": ["too long", "bad char"]}) == ["name: too long", "name: bad char"]
    assert field_errors([{"pointer": "/steps", "detail": "must be positive"}]) == ["/steps: must be positive"]
    assert field_errors(None) == []


def test_validation_headline_does_not_repeat_the_first_field_error() -> None:
    err = error_for_status(422, PROBLEM_422, url="u")
    assert err.message == "invalid request: Request validation failed"


def test_messages_with_brackets_are_printed_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.errors import CliError
    from cli.main import report

    report(CliError("name: should match '^[a-z0-9]$'", details=["x: [rank 0] detail"]))
    err = capsys.readouterr().err
    assert "'^[a-z0-9]$'" in err and "[rank 0] detail" in err
