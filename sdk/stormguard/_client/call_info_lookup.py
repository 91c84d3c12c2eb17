"""``stormguard.call_info(x)``: the ``CallInfo`` of whatever a call gave back.

stormguard's own results, streams and raw responses carry it as ``.call_info``;
under openai-python (``stormguard.OpenAI``, or ``openai.OpenAI(http_client=
stormguard.httpx_client())``) it travels on the HTTP response the transport hands
openai (``response.extensions["stormguard"]``), which openai's raw responses,
streams and status errors keep, and ``stormguard.OpenAI`` keeps it on each result it
parses too. One function finds it in any of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._core.exceptions import APIError, StormguardError
from .._core.results import CALL_INFO_EXTENSION, CallInfo

__all__ = ["CALL_INFO_ATTRIBUTE", "call_info", "error_info"]

#: Where ``stormguard.OpenAI`` keeps a parsed result's ``CallInfo``
#: (``_transport/openai_client.py``).
CALL_INFO_ATTRIBUTE = "_stormguard_call_info"


def call_info(obj: object) -> CallInfo | None:
    """The ``CallInfo`` of the call that gave ``obj`` (attempts, server load, request
    id, stop reason): a result, a stream, a raw response (stormguard's or openai's), an
    httpx response the transport answered, or an error (stormguard's, or openai's over
    stormguard's transport). None for anything else."""
    own = getattr(obj, "call_info", None)
    if isinstance(own, CallInfo):
        return own
    kept = getattr(obj, "__dict__", {}).get(CALL_INFO_ATTRIBUTE)
    if isinstance(kept, CallInfo):
        return kept
    for response in (obj, getattr(obj, "http_response", None), getattr(obj, "response", None)):
        extensions = getattr(response, "extensions", None)
        if isinstance(extensions, Mapping):
            info = extensions.get(CALL_INFO_EXTENSION)
            if isinstance(info, CallInfo):
                return info
    if isinstance(obj, StormguardError):
        return error_info(obj, None)
    return None


def error_info(error: StormguardError, model: str | None) -> CallInfo:
    """The ``CallInfo`` of a call that failed with ``error``: what the error knows."""
    info = CallInfo(
        server_load=error.server_load,
        attempt_history=error.attempt_history,
        request_id=error.request_id if isinstance(error, APIError) else None,
        model=model,
        rate_limit=error.rate_limit,
    )
    info.precheck = error.precheck
    info.stop_reason = error.retry_stopped_by
    return info
