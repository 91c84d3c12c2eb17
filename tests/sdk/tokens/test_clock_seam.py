"""One clock seam: a token policy (its lookups' back-off and cache, its rate limiter)
made without a clock of its own reads its client's, so ``Client(clock=FakeClock())``
fakes all of a call's time; one given a clock keeps it."""

from __future__ import annotations

import pytest

import stormguard
from stormguard.testing import FakeClock
from stormguard.tokens import ServerTokenizeCounter, TokenPolicy, TokenRateLimiter


def test_a_policy_without_a_clock_takes_its_clients() -> None:
    clock = FakeClock()
    limiter = TokenRateLimiter(tokens_per_minute=60, burst=10)  # 1 token/s
    policy = TokenPolicy(rate_limiter=limiter)
    stormguard.Client(base_url="http://llm.test/v1", clock=clock, token_policy=policy).close()
    assert limiter.reserve(10).wait == 0.0
    assert limiter.reserve(5).wait == pytest.approx(5.0)  # the bucket is empty
    clock.advance(5.0)
    assert limiter.reserve(5).wait == pytest.approx(5.0)  # 5 s on the fake clock refilled 5
    assert policy.server_counter._clock.now() == clock.now()
    assert policy.server_context_windows._clock.now() == clock.now()


def test_a_clock_given_to_the_policy_is_kept() -> None:
    own = FakeClock()
    own.advance(1000.0)
    counter_clock = FakeClock()
    limiter = TokenRateLimiter(tokens_per_minute=60, clock=own)
    policy = TokenPolicy(rate_limiter=limiter, clock=counter_clock.now)
    stormguard.Client(base_url="http://llm.test/v1", clock=FakeClock(), token_policy=policy).close()
    assert limiter._clock.now() == own.now() == 1000.0
    assert policy.server_counter._clock.now() == counter_clock.now()


def test_a_clock_object_or_a_function_and_a_clear_error_otherwise() -> None:
    clock = FakeClock()
    clock.advance(3.0)
    assert ServerTokenizeCounter(clock=clock)._clock.now() == 3.0
    assert ServerTokenizeCounter(clock=clock.now)._clock.now() == 3.0
    with pytest.raises(TypeError, match="clock must be a stormguard Clock or a function"):
        TokenRateLimiter(tokens_per_minute=60, clock=3.0)  # type: ignore[arg-type]
