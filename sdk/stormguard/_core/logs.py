"""The SDK's log lines (retries, quotas, tiers, fallbacks), switched on as
openai-python's ``OPENAI_LOG`` is.

``STORMGUARD_LOG=info`` (or ``debug``) in the environment, read at import, sets the
``stormguard`` logger to that level and gives the root logger a handler if it has
none (``logging.basicConfig``), as openai-python's ``_utils/_logs.py`` does. An
application that configures logging itself can set the ``stormguard`` logger's
level instead.

At INFO, one line per retry, failover and requeue: which attempt failed, why,
where the next one goes and after how long; and for a key's quota, one line when
calls first wait for it and one when its limit is learned (or changes), naming the
key by its fingerprint, never the key; with deployments of several tiers, one line
when a model's calls leave their preferred tier (and why) and one when they
return to it; and one line when a call moves to another model (a fallback), with
why. A store that shares the quotas (a Redis, this machine's quota directory) and
stops answering gets one WARNING (logged whatever ``STORMGUARD_LOG`` says, as Python
logs warnings), and one INFO line when it answers again; both name it (a Redis by
its host and port, never a password). At DEBUG also one
line when the loop
stops retrying, with its reason. Every text in a line that came from outside (an
error's message, a URL) passes through the call's ``Redactor`` first, so an API
key a server echoes back is logged as ``[redacted]``.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .redact import Redactor
    from .stop_reason import StopReason

__all__ = [
    "fell_back",
    "logger",
    "quota_learned",
    "quota_store_back",
    "quota_store_down",
    "quota_waiting",
    "retry_stopped",
    "retrying",
    "setup_logging",
    "tier_left",
    "tier_returned",
]

logger: logging.Logger = logging.getLogger("stormguard")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO}
#: How much of an error's message a line quotes.
_QUOTE = 200


def setup_logging() -> None:
    """Apply ``STORMGUARD_LOG`` (``info`` or ``debug``; anything else: nothing)."""
    level = _LEVELS.get(os.environ.get("STORMGUARD_LOG", "").strip().lower())
    if level is None:
        return
    # openai's format, with the logger's name: [2024-10-05 14:12:26 - stormguard:<line>
    # - INFO] POST /chat/completions attempt 1 failed (...); retrying in 0.412 s
    logging.basicConfig(
        format="[%(asctime)s - %(name)s:%(lineno)d - %(levelname)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    logger.setLevel(level)


def _reason(error: BaseException | None, redactor: Redactor) -> str:
    if error is None:
        return "no error"
    status = getattr(error, "status_code", None)
    kind = type(error).__name__ if status is None else f"{type(error).__name__} {status}"
    message = str(error)
    return f"{kind}: {redactor.quote(message, _QUOTE)}" if message else kind


def retrying(
    *,
    outcome: str,
    attempt: int,
    method: str,
    path: str,
    endpoint: str | None,
    error: BaseException | None,
    wait: float,
    redactor: Redactor,
) -> None:
    """One INFO line for an attempt that another follows (``retry``, ``failover``,
    ``requeued`` or ``paced``)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    # The path without its query (which may hold a credential), and the endpoint's
    # host:port: never a URL's userinfo.
    where = "/" + path.partition("?")[0].lstrip("/")
    if outcome == "requeued":
        then = f"requeued locally, next attempt in {wait:.3f} s"
    elif outcome == "paced":
        then = "back to the key's quota pacer, next attempt when the key has room"
    elif outcome == "failover":
        then = f"failing over to another endpoint in {wait:.3f} s"
    else:
        then = f"retrying in {wait:.3f} s"
    logger.info(
        "%s %s%s attempt %d failed (%s); %s",
        method,
        where,
        "" if endpoint is None else f" at {redactor.scrub(endpoint)}",
        attempt,
        _reason(error, redactor),
        then,
    )


def retry_stopped(
    *, reason: StopReason, attempt: int, error: BaseException | None, redactor: Redactor
) -> None:
    """One DEBUG line when the retry loop stops after a failed attempt."""
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "not retrying after attempt %d (%s): %s",
            attempt,
            _reason(error, redactor),
            reason,
        )


def quota_waiting(*, key: str, model: str, wait: float) -> None:
    """One INFO line when calls first wait for a key's quota (``key``: its fingerprint)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "pacing calls to the quota of key %s (model %s): the first waits %.3f s",
            key,
            model,
            wait,
        )


def quota_learned(*, key: str, model: str, dimension: str, limit: float) -> None:
    """One INFO line when a key's limit is learned or changes."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("quota of key %s (model %s): %g %s per minute", key, model, limit, dimension)


def fell_back(
    *, from_model: str | None, to_model: str, kind: object, error: BaseException, redactor: Redactor
) -> None:
    """One INFO line when a call moves to another model, with why."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "call moves from model %s to %s (%s): %s",
            from_model,
            to_model,
            kind,
            _reason(error, redactor),
        )


def tier_left(*, model: str | None, tier: int, to: int | None, why: str) -> None:
    """One INFO line when a model's calls leave their preferred tier."""
    if logger.isEnabledFor(logging.INFO):
        where = "no tier is in rotation" if to is None else f"calls go to tier {to}"
        logger.info("tier %d left for model %s: %s; %s", tier, model, why, where)


def tier_returned(*, model: str | None, tier: int) -> None:
    """One INFO line when a model's calls return to their preferred tier."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "tier %d back in rotation for model %s: calls return to it as its"
            " concurrency limit ramps up",
            tier,
            model,
        )


def quota_store_down(*, what: str, error: str, retry: float) -> None:
    """One WARNING when the store that shares the quotas (a Redis, this machine's
    quota files) fails, once per outage."""
    logger.warning(
        "sharing the quotas through the %s failed (%s): pacing each key in this"
        " process alone, trying again in %.1f s",
        what,
        error,
        retry,
    )


def quota_store_back(*, what: str) -> None:
    """One INFO line when that store answers again."""
    if logger.isEnabledFor(logging.INFO):
        logger.info("the %s answers again: the quotas are shared through it", what)
