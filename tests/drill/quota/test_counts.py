"""What the quota drill reads of the server's ``/metrics``: the chat route's answers by
status (not the other routes'), and the key's admissions, charges and refusals."""

from __future__ import annotations

from stormguard_drill.quota.runner import server_counts

METRICS = """\
# HELP stormguard_responses_total HTTP responses by route and status.
# TYPE stormguard_responses_total counter
stormguard_responses_total{route="/v1/chat/completions",status="200"} 300.0
stormguard_responses_total{route="/v1/chat/completions",status="429"} 57.0
stormguard_responses_total{route="/metrics",status="200"} 80.0
stormguard_responses_total{route="/tokenize",status="200"} 12.0
# HELP stormguard_quota_admitted_total Requests charged to a key's quota.
# TYPE stormguard_quota_admitted_total counter
stormguard_quota_admitted_total{key="322ad2605eaf"} 300.0
# HELP stormguard_quota_tokens_charged_total Tokens charged to a key's quota.
# TYPE stormguard_quota_tokens_charged_total counter
stormguard_quota_tokens_charged_total{key="322ad2605eaf"} 94512.0
# HELP stormguard_quota_refused_total Requests a key's quota refused (429), by reason.
# TYPE stormguard_quota_refused_total counter
stormguard_quota_refused_total{key="322ad2605eaf",reason="tokens"} 55.0
stormguard_quota_refused_total{key="322ad2605eaf",reason="requests"} 2.0
"""


def test_the_chat_routes_answers_and_the_keys_counts() -> None:
    assert server_counts(METRICS) == {
        "requests": 357,
        "responses_by_status": {"200": 300, "429": 57},
        "quota_admitted": 300,
        "quota_tokens_charged": 94512,
        "quota_refused_by_reason": {"requests": 2, "tokens": 55},
    }


def test_a_server_that_saw_no_call_counts_zero() -> None:
    assert server_counts("") == {
        "requests": 0,
        "responses_by_status": {},
        "quota_admitted": 0,
        "quota_tokens_charged": 0,
        "quota_refused_by_reason": {},
    }
