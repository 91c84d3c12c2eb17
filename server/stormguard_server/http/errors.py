"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}``.

openai-python reads ``error.message`` and ``error.code`` from this shape, so
every refusal, validation failure and engine failure uses it.
"""

from __future__ import annotations

from collections.abc import Mapping

from stormguard_server.http.json_response import JSONResponse

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",  # as OpenAI's own 401 (invalid_api_key)
    403: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout",  # the client's body was late: a timeout, as for 504
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}


def error_body(
    message: str, *, status: int, code: str | None = None, param: str | None = None
) -> dict[str, dict[str, str | None]]:
    """The JSON body of an error answer."""
    return {
        "error": {
            "message": message,
            "type": _TYPE_BY_STATUS.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error answer with an OpenAI-style body."""
    return JSONResponse(
        error_body(message, status=status, code=code, param=param),
        status_code=status,
        headers=dict(headers or {}),
    )
