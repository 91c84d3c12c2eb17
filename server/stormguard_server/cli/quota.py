"""The quota's flags (quota/buckets.py): each one's type, default and help, the
``QuotaConfig`` they describe, and the checks across flags argparse cannot make.
``cli.flags`` adds them to the parser, ``cli.config`` reads them."""

from __future__ import annotations

import argparse

from stormguard_server.config import RETRY_AFTER_MODES, QuotaConfig
from stormguard_server.quota.buckets import MAX_DEFAULT_MAX_TOKENS, MAX_LIMIT, check_limit

_QUOTA = QuotaConfig()
# Each flag's dest, and the QuotaConfig field it sets: given if not at its default.
_FIELDS = {
    "quota_tpm": "tokens_per_minute",
    "quota_rpm": "requests_per_minute",
    "quota_daily_tokens": "tokens_per_day",
    "quota_default_max_tokens": "default_max_tokens",
    "quota_retry_after": "retry_after",
    "quota_headers": "headers",
    "quota_insufficient": "insufficient_quota",
}
# The flags that turn the quota on; the others only shape it.
_SWITCHES = ("quota_tpm", "quota_rpm", "quota_daily_tokens", "quota_insufficient")


def _whole(text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    try:
        return check_limit(value, low=low, high=high)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit(text: str) -> int:
    return _whole(text, 1, MAX_LIMIT)


def _default_max_tokens(text: str) -> int:
    return _whole(text, 0, MAX_DEFAULT_MAX_TOKENS)


def add_quota_flags(parser: argparse.ArgumentParser) -> None:
    """The ``quota`` group of flags."""
    quota = parser.add_argument_group(
        "quota",
        "A hosted API's quota per API key (the bearer token, or Azure's api-key header; no "
        "key is one anonymous key), as OpenAI enforces it: off unless a limit is given. A "
        "request is charged 1 request and its prompt tokens + max_tokens when it arrives, "
        "never refunded; over a limit it gets OpenAI's 429 rate_limit_exceeded. See "
        "docs/server.md, Hosted-API quota",
    )
    quota.add_argument(
        "--quota-tpm",
        type=_limit,
        default=None,
        metavar="TOKENS",
        help="tokens per minute per key: a bucket of this many tokens, refilled at TOKENS/60 "
        "a second (off when not given)",
    )
    quota.add_argument(
        "--quota-rpm",
        type=_limit,
        default=None,
        metavar="REQUESTS",
        help="requests per minute per key: a bucket of this many requests, refilled at "
        "REQUESTS/60 a second (off when not given)",
    )
    quota.add_argument(
        "--quota-daily-tokens",
        type=_limit,
        default=None,
        metavar="TOKENS",
        help="tokens per key per day (from its first request); past it every request of "
        "the key gets 429 insufficient_quota (off when not given)",
    )
    quota.add_argument(
        "--quota-default-max-tokens",
        type=_default_max_tokens,
        default=_QUOTA.default_max_tokens,
        metavar="TOKENS",
        help="output tokens charged for a request that sends no max_tokens",
    )
    quota.add_argument(
        "--quota-retry-after",
        choices=RETRY_AFTER_MODES,
        default=_QUOTA.retry_after,
        help="where a quota 429 says when to come back: nowhere, retry-after (whole seconds, "
        "rounded up), retry-after-ms, or Azure's x-ms-retry-after-ms",
    )
    quota.add_argument(
        "--quota-headers",
        action=argparse.BooleanOptionalAction,
        default=_QUOTA.headers,
        help="send OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} on every "
        "response of a charged route (--no-quota-headers: none, as some proxies)",
    )
    quota.add_argument(
        "--quota-insufficient",
        action="store_true",
        default=_QUOTA.insufficient_quota,
        help="answer every charged request with 429 insufficient_quota (out of credit); the "
        "admin endpoint switches it too (POST /admin/quota)",
    )


def quota_config(args: argparse.Namespace) -> QuotaConfig:
    """The QuotaConfig the parsed flags describe."""
    return QuotaConfig(**{field: getattr(args, dest) for dest, field in _FIELDS.items()})


def check_quota_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse quota flags that cannot act: with vLLM (this server charges, vLLM does
    not), or a setting of the quota given without a limit to apply it to."""
    given = [
        dest for dest, field in _FIELDS.items() if getattr(args, dest) != getattr(_QUOTA, field)
    ]
    if not given:
        return
    flag = "--" + given[0].replace("_", "-")
    if args.engine == "vllm":
        parser.error(f"{flag} needs --engine sim: the quota is charged by this server")
    if not set(given) & set(_SWITCHES):
        parser.error(
            f"{flag} sets a quota that is off: give --quota-tpm, --quota-rpm, "
            "--quota-daily-tokens or --quota-insufficient"
        )
