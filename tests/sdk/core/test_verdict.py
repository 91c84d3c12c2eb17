"""One classification of an attempt's outcome: what each policy reads of it."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import stormguard
from stormguard._core.exceptions import status_error_class
from stormguard._core.stop_reason import StopReason
from stormguard._core.verdict import LimitOutcome, Verdict, classify
from stormguard._policies.fallback import is_fallback_worthy
from stormguard._policies.limiter.limiter import is_shed, limit_outcome, stream_cut_outcome
from stormguard._policies.retry.throttle import is_accept
from stormguard.protocol import ServerLoad

DOCS = Path(__file__).resolve().parents[3] / "docs"

QUOTA = {"message": "out of credit", "type": "insufficient_quota", "code": "insufficient_quota"}


def status(code: int, *, body: object = None, **load: Any) -> stormguard.APIStatusError:
    return status_error_class(code)(
        "x", status_code=code, body=body, server_load=ServerLoad(**load)
    )


# What a failure that was sent and refused or failed says by default; each row
# overrides what differs.
SENT = Verdict(
    retry=False,
    stop=StopReason.NOT_RETRYABLE,
    fallback=False,
    breaker_failure=False,
    sent=True,
    accepted=False,
    shed=False,
    requeue=False,
    limit=LimitOutcome.IGNORED,
    limit_after_first_chunk=LimitOutcome.IGNORED,
    too_long=False,
    out_of_quota=False,
)
LOCAL = replace(SENT, sent=False)  # refused or ended in this process: nothing went out
RETRY: dict[str, Any] = {"retry": True, "stop": None}
SHED: dict[str, Any] = {**RETRY, "fallback": True, "shed": True, "requeue": True}
CRASH: dict[str, Any] = {**RETRY, "fallback": True, "breaker_failure": True}
CONTEXT = stormguard.ContextWindowExceededError(
    "big", model="m", prompt_tokens=9, max_tokens=9, context_window=8, counter="c"
)

CASES = [
    pytest.param(
        None,
        replace(SENT, stop=None, accepted=True, limit=LimitOutcome.SUCCESS),
        id="success",
    ),
    pytest.param(
        status(503, load_shed="queue_full", retry_after=1.0),
        replace(
            SENT,
            **SHED,
            limit=LimitOutcome.DROPPED,
            limit_after_first_chunk=LimitOutcome.CUT,
        ),
        id="503-shed",
    ),
    pytest.param(
        status(503),
        replace(
            SENT,
            **SHED,
            limit=LimitOutcome.DROPPED,
            limit_after_first_chunk=LimitOutcome.CUT,
        ),
        id="503-vllm-queue-full",
    ),
    pytest.param(
        status(503, load_shed="engine_restart"),
        replace(
            SENT,
            **SHED,
            limit=LimitOutcome.RESTARTING,
            limit_after_first_chunk=LimitOutcome.CUT,
        ),
        id="503-restart",
    ),
    pytest.param(
        status(503, load_shed="retry_shed", should_retry=False),
        replace(
            SENT,
            stop=StopReason.SHOULD_RETRY_FALSE,
            fallback=True,
            shed=True,
            limit=LimitOutcome.DROPPED,
            limit_after_first_chunk=LimitOutcome.CUT,
        ),
        id="503-should-retry-false",
    ),
    pytest.param(
        status(429),
        replace(SENT, **SHED, limit=LimitOutcome.DROPPED),
        id="429-rate",
    ),
    pytest.param(
        status(429, body={"message": "Rate limit reached", "code": "rate_limit_exceeded"}),
        replace(SENT, **SHED, limit=LimitOutcome.DROPPED, quota=True),
        id="429-rate-limit-exceeded",
    ),
    pytest.param(
        status(429, body={"message": "busy", "code": "rate_limit_exceeded"}, load_shed="x"),
        replace(SENT, **SHED, limit=LimitOutcome.DROPPED),
        id="429-rate-limit-exceeded-with-a-shed-marker",
    ),
    pytest.param(
        status(
            429,
            body={
                "message": "Request too large for m in organization org-x on tokens per min",
                "code": "rate_limit_exceeded",
            },
        ),
        replace(SENT, fallback=True),
        id="429-request-too-large",
    ),
    pytest.param(
        stormguard.QuotaWaitError(
            "no room", key="k", model="m", wait=9.0, least_wait=9.0, remaining=1.0
        ),
        replace(LOCAL, stop=StopReason.DEADLINE, fallback=True),
        id="quota-wait",
    ),
    pytest.param(
        status(429, body=QUOTA),
        replace(SENT, out_of_quota=True),
        id="429-quota",
    ),
    pytest.param(
        status(429, body=QUOTA, should_retry=True),
        replace(SENT, out_of_quota=True),
        id="429-quota-should-retry-true",
    ),
    pytest.param(
        status(400, load_shed="too_long", should_retry=False),
        replace(SENT, stop=StopReason.SHOULD_RETRY_FALSE, accepted=True, too_long=True),
        id="400-too-long",
    ),
    pytest.param(
        status(400, body={"code": "context_length_exceeded", "message": "too long"}),
        replace(SENT, accepted=True, too_long=True),
        id="400-context-length-exceeded-openai",
    ),
    pytest.param(
        status(
            400,
            body={
                "message": "This model's maximum context length is 8192 tokens. However, you"
                " requested 9000 tokens (8000 in the messages, 1000 in the completion).",
                "type": "BadRequestError",
            },
        ),
        replace(SENT, accepted=True, too_long=True),
        id="400-context-length-vllm-message",
    ),
    pytest.param(
        status(400, body={"message": "prompt is too long: 210000 tokens > 200000 maximum"}),
        replace(SENT, accepted=True, too_long=True),
        id="400-context-length-anthropic-message",
    ),
    pytest.param(
        status(400, body={"code": "content_filter", "message": "filtered"}),
        replace(SENT, accepted=True, content_policy=True),
        id="400-content-filter-azure",
    ),
    pytest.param(
        status(400, body={"code": "content_policy_violation", "message": "refused"}),
        replace(SENT, accepted=True, content_policy=True),
        id="400-content-policy-openai",
    ),
    pytest.param(
        status(
            400,
            body={
                "message": "The response was filtered due to the prompt triggering Azure"
                " OpenAI's content management policy."
            },
        ),
        replace(SENT, accepted=True, content_policy=True),
        id="400-content-policy-azure-message",
    ),
    pytest.param(
        status(422, body={"code": "context_length_exceeded"}),
        replace(SENT, accepted=True),
        id="422-is-not-a-context-refusal",
    ),
    pytest.param(
        status(503, load_shed="too_long", should_retry=False),
        replace(
            SENT,
            stop=StopReason.SHOULD_RETRY_FALSE,
            too_long=True,
            limit_after_first_chunk=LimitOutcome.CUT,
        ),
        id="503-too-long",
    ),
    pytest.param(
        status(500),
        replace(SENT, **CRASH, limit_after_first_chunk=LimitOutcome.CUT),
        id="500",
    ),
    pytest.param(
        status(501),
        replace(SENT, breaker_failure=True, limit_after_first_chunk=LimitOutcome.CUT),
        id="501",
    ),
    pytest.param(status(408), replace(SENT, **CRASH), id="408"),
    pytest.param(status(404), replace(SENT, accepted=True), id="404"),
    pytest.param(
        status(400, should_retry=True), replace(SENT, **RETRY, accepted=True), id="400-sr"
    ),
    pytest.param(
        stormguard.StreamInterruptedError("cut", chunks_received=0),
        replace(SENT, **CRASH, limit_after_first_chunk=LimitOutcome.CUT),
        id="stream-cut-before-first-chunk",
    ),
    pytest.param(
        stormguard.StreamInterruptedError("cut", chunks_received=3),
        replace(SENT, accepted=True, limit_after_first_chunk=LimitOutcome.CUT),
        id="stream-cut-after-first-chunk",
    ),
    pytest.param(
        stormguard.APITimeoutError("t"),
        replace(SENT, **CRASH),
        id="timeout-before-response",
    ),
    pytest.param(
        stormguard.APITimeoutError("t", response_started=True),
        replace(SENT, breaker_failure=True),
        id="timeout-after-response-start",
    ),
    pytest.param(stormguard.APIConnectionError("refused"), replace(SENT, **CRASH), id="refused"),
    pytest.param(
        stormguard.APIResponseValidationError("bad", status_code=200),
        replace(SENT, breaker_failure=True),
        id="bad-body",
    ),
    pytest.param(
        stormguard.CircuitOpenError("open", breaker="b"),
        replace(LOCAL, stop=StopReason.CIRCUIT_OPEN, fallback=True),
        id="circuit-open",
    ),
    pytest.param(
        stormguard.ThrottledError("t", probability=0.5),
        replace(LOCAL, stop=StopReason.THROTTLED),
        id="throttled",
    ),
    pytest.param(
        stormguard.QueueTimeoutError("q", queued_s=1.0),
        replace(LOCAL, stop=StopReason.DEADLINE, fallback=True),
        id="queue-timeout",
    ),
    pytest.param(
        stormguard.LocalQueueFullError("full", endpoint="e", waiting=5),
        replace(LOCAL, stop=StopReason.QUEUE_FULL),
        id="local-queue-full",
    ),
    pytest.param(asyncio.CancelledError(), replace(LOCAL, stop=StopReason.CANCELLED), id="cancel"),
    pytest.param(KeyboardInterrupt(), replace(LOCAL, stop=StopReason.CANCELLED), id="interrupt"),
    pytest.param(
        stormguard.ClientClosedError(),
        replace(LOCAL, stop=StopReason.CANCELLED),
        id="client-closed",
    ),
    pytest.param(stormguard.EventLoopMismatchError("loop"), LOCAL, id="event-loop-mismatch"),
    pytest.param(stormguard.TokenRateLimitedError("t", tokens=1, wait=1.0), LOCAL, id="token-rate"),
    pytest.param(CONTEXT, replace(LOCAL, too_long=True), id="context-window"),
    pytest.param(ValueError("caller bug"), LOCAL, id="other"),
]


@pytest.mark.parametrize(("error", "verdict"), CASES)
def test_classify(error: BaseException | None, verdict: Verdict) -> None:
    assert classify(error) == verdict
    assert classify(error, stormguard.RetryPolicy()) == verdict


@pytest.mark.parametrize(("error", "verdict"), CASES)
def test_each_policy_reads_the_verdict(error: BaseException | None, verdict: Verdict) -> None:
    if error is not None:
        decision = stormguard.RetryPolicy().decide(error)
        assert (decision.retry, decision.reason) == (verdict.retry, verdict.stop)
        assert is_fallback_worthy(error) is verdict.fallback
        assert stream_cut_outcome(error) is verdict.limit_after_first_chunk
    assert is_accept(error) is verdict.accepted
    assert is_shed(error) is verdict.shed
    assert limit_outcome(error) is verdict.limit


def test_only_the_retry_decision_depends_on_the_policy() -> None:
    shed = status(503, load_shed="queue_full")
    strict = stormguard.RetryPolicy(retry_statuses=frozenset({500}))
    assert classify(shed, strict) == replace(
        classify(shed), retry=False, stop=StopReason.NOT_RETRYABLE
    )
    assert classify(shed, strict).requeue  # a shed still goes back to the local queue


def test_a_stop_reason_is_its_string() -> None:
    assert StopReason.BUDGET == "budget" and f"{StopReason.DEADLINE}" == "deadline"
    assert str(StopReason.CIRCUIT_OPEN) == "circuit_open"
    assert {StopReason.MAX_ATTEMPTS: 1}["max_attempts"] == 1


def _documented(doc: Path, heading: str) -> list[str]:
    """The first column of the rows of the table under ``heading`` in ``doc``."""
    section = doc.read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    rows = section.split("|---|", 1)[1]  # below the header row
    return re.findall(r"^\| `([a-z_]+)` \|", rows, flags=re.MULTILINE)


def test_the_documented_stop_reasons_are_the_enum() -> None:
    documented = _documented(DOCS / "retries.md", "## Why retrying stopped")
    assert len(documented) == len(set(documented))
    assert set(documented) == {reason.value for reason in StopReason}


def test_the_span_attribute_lists_every_stop_reason() -> None:
    """docs/tracing.md's row for ``stormguard.retry.stop_reason`` names each member."""
    row = next(
        line
        for line in (DOCS / "tracing.md").read_text().splitlines()
        if line.startswith("| `stormguard.retry.stop_reason`")
    )
    listed = re.findall(r"`([a-z_]+)`", row.split("|")[2])
    assert set(listed) == {reason.value for reason in StopReason}
