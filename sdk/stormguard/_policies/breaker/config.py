"""When a circuit breaker trips and how it recovers: ``BreakerConfig``, checked once.

The split between a failure rate over a window and a slow-call rate is
resilience4j's. Defaults, and the reasons for them (docs/breakers.md has the
long version):

* Count-based window of the last ``window_size=100`` outcomes, trip at
  ``failure_rate_threshold=0.5`` once ``minimum_calls=50`` are in it:
  resilience4j's window and rate. A window of 20 trips "at 50 %" on noise
  (with 20 % transient errors, ten failures in some 20 consecutive calls in
  14 % of 250-call runs; none in 4,000 simulated runs with 100), while 50 %
  errors still always trip. Count-based, not time-based, because the evidence
  is then the same calls for a quiet client and a busy one: a 10-second time
  window would never reach ``minimum_calls`` for a client calling every few
  seconds, and its breaker could never trip on rate.
* ``consecutive_failures=10``: twice Envoy outlier detection's
  ``consecutive_5xx`` default. It catches a crash before ``minimum_calls``
  are in the window; five in a row happen about once in 3,000 calls at 20 %
  transient errors, ten in a row once in 10^7.
* ``slow_call_duration=None``: off. LLM latency is mostly output length, so no
  default threshold is right; when set, a call longer than it is slow, and
  ``slow_call_rate_threshold=0.8`` of slow calls in the window trips: near all,
  since a mix of long and short generations is normal. Pass time to first
  token for streams.
* ``open_time=5`` s, doubled on each re-trip from half-open, capped at
  ``max_open_time=60`` s, never shorter than the server's ``Retry-After``: the
  server knows when it will be back (the reference server says so from its
  restart and drain times), 5 s costs little when it was a blip, and doubling
  reaches the cap in four re-trips (5, 10, 20, 40, 60). Envoy grows its
  ejection time with each ejection too (``base_ejection_time`` times the
  ejections, up to ``max_ejection_time``). The cap matches
  ``RetryPolicy.max_retry_after``: a server cannot park a client for an hour.
* ``jitter=0.1``: the open time is lengthened by up to 10 %, never shortened
  (so it stays at least the Retry-After). One crash trips every client's
  breaker in the same second; without jitter all of them would probe in the
  same second too (Envoy offers ``max_ejection_time_jitter`` as well).
* ``half_open_calls=2`` concurrent probes, ``half_open_successes=2`` to close;
  any probe failure re-opens. Two, so a still-sick server gets two requests
  per client per open period, not a flood (the OOM-avalanche write-up:
  recover with a small share of traffic after warm-up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BreakerConfig"]


@dataclass(frozen=True, kw_only=True)
class BreakerConfig:
    """When a breaker trips and how it recovers; one template for every (endpoint, model).

    >>> BreakerConfig().successes_to_close
    2
    >>> BreakerConfig(slow_call_duration=30.0, open_time=10.0).max_open_time
    60.0
    """

    #: resilience4j's window of 100 calls. A window of 20 trips "at 50% failures"
    #: on noise: with 20% transient errors some 20 consecutive calls hold ten
    #: failures in 14% of 250-call runs; with 100 calls (rate judged from the 50th)
    #: none did in 4,000 simulated runs of 1,000 calls, while 50% errors always trip.
    window_size: int = 100
    minimum_calls: int = 50
    failure_rate_threshold: float = 0.5
    #: None: only the failure rate trips the breaker. Ten, not Envoy's five: an
    #: endpoint with 20% transient errors would see five in a row about once in
    #: 3,000 calls and be cut off for seconds; ten in a row at 20% is a 1-in-10^7
    #: event, while a real outage still trips it within ten calls.
    consecutive_failures: int | None = 10
    #: Seconds; None: slow calls are not tracked.
    slow_call_duration: float | None = None
    slow_call_rate_threshold: float = 0.8
    open_time: float = 5.0
    max_open_time: float = 60.0
    jitter: float = 0.1
    half_open_calls: int = 2
    #: None: as many as ``half_open_calls``.
    half_open_successes: int | None = None

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ValueError(f"window_size must be at least 1, got {self.window_size}")
        if not 1 <= self.minimum_calls <= self.window_size:
            raise ValueError("minimum_calls must be between 1 and window_size")
        for name in ("failure_rate_threshold", "slow_call_rate_threshold"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        if self.consecutive_failures is not None and self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be at least 1 (or None for off)")
        if self.slow_call_duration is not None and not (
            math.isfinite(self.slow_call_duration) and self.slow_call_duration > 0
        ):
            raise ValueError("slow_call_duration must be a positive number of seconds or None")
        if not (math.isfinite(self.open_time) and self.open_time > 0):
            raise ValueError(
                f"open_time must be a positive number of seconds, got {self.open_time!r}"
            )
        if not (math.isfinite(self.max_open_time) and self.max_open_time >= self.open_time):
            raise ValueError("max_open_time must be a finite number >= open_time")
        if not (math.isfinite(self.jitter) and 0 <= self.jitter <= 1):
            raise ValueError(f"jitter must be in [0, 1], got {self.jitter!r}")
        if self.half_open_calls < 1:
            raise ValueError("half_open_calls must be at least 1")
        if self.half_open_successes is not None and self.half_open_successes < 1:
            raise ValueError("half_open_successes must be at least 1 (or None)")

    @property
    def successes_to_close(self) -> int:
        """Probe successes that close a half-open breaker."""
        if self.half_open_successes is None:
            return self.half_open_calls
        return self.half_open_successes
