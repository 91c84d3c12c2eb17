"""Latency-aware choice: each endpoint's peak-EWMA latency estimate, and the
cost the picker ranks endpoints by when ``LatencyRouting`` is on.

A count of this client's own calls in flight cannot see a replica slowed by
someone else's load (another client's flood of long prefills, a batch job):
both replicas look idle to us, and one answers ten times slower. Finagle's and
Linkerd's "peak EWMA" balancers (Finagle's ``loadbalancer/PeakEwma.scala``,
tower's ``load/peak_ewma.rs``) rank endpoints by ``(load + 1) * latency``:

- A sample above the estimate replaces it at once (the peak): a replica that
  turned slow is avoided after one slow answer.
- A sample below it is blended in with a weight that depends on the time since
  the last sample, ``w = exp(-dt / decay)``: ``estimate * w + sample * (1 - w)``,
  so that the estimate spans about ``decay`` seconds whatever the call rate (the
  samples are an unevenly spaced series; Finagle cites Eckner's algorithms for
  those).
- Read between samples, the estimate decays toward zero with the same time
  constant (both balancers decay it on every read, as a sample of 0 would): an
  endpoint avoided since its last slow answer looks faster and faster until
  it gets a call again, and that call's answer says whether it still is slow.
  Unlike theirs, the read here changes nothing, so the estimate does not depend
  on how often the picker looks.

**What an LLM's latency sample is.** A raw latency is mostly the answer's
length: 2,000 tokens take 40 times as long as 50 on the same idle replica, so
raw latencies rank endpoints by the luck of which got long answers. LiteLLM's
lowest-latency router (``router_strategy/lowest_latency.py``) keeps time to
first token for streams and latency per completion token for plain calls, two
lists per deployment. So does this: two estimates per endpoint, and a call is
ranked by the one of its kind.

- A stream's sample is its time to the first chunk, the moment the attempt
  succeeds for every policy (the limiter's first-token time, a hedge race's
  "answered"): queueing and prefill, what another client's load slows down.
- A plain call's sample is its latency divided by its completion tokens (from
  its ``usage``; a call without them, such as embeddings or a body the caller
  reads later, gives none: its latency is in another unit), and by no fewer than
  ``MIN_TOKENS`` (16). A short answer's time is mostly what every call pays once
  (the round trip, queueing, prefill): divided by its own 1 or 2 tokens, that
  part would swing 16-fold between two answers of one replica, and a peak-
  sensitive estimate takes the highest swing (a fast replica's one-token answer
  looked slower than a slow replica's eight-token one, end to end). Below 16
  tokens the samples are latencies on one scale; above, per token, as LiteLLM's.
- A stream attempt that ended before its first chunk after ``t`` seconds,
  cancelled (a hedge race's loser, the caller leaving) or timed out, gives a
  lower bound: the first chunk would have taken more than ``t``. It raises the
  estimate as a peak would and never lowers it (LiteLLM counts a timeout as a
  1,000 s latency; a bound is what is known). Other failures give no sample: a
  fast 503 says nothing of speed, and the breaker and ejection judge errors.
- A stream attempt still waiting for its first chunk after ``t`` seconds is the
  same bound, known now: read for a stream, an endpoint's estimate is at least
  the wait of its oldest such attempt (``EndpointState.latency``). A replica that
  turned slow right after a fast answer otherwise goes silent, its estimate
  decays while the calls sent to it wait, and it draws more of them until the
  first comes back (load alone holds them off only after several). Finagle and
  tower count such calls only in the load.

**No sample yet.** An endpoint without an estimate of the call's kind is
ranked as the fastest estimate among those being compared (tower starts one at
a default of 1 s, Finagle at 0 with a penalty once a call is pending; a fixed
default means nothing for LLMs, whose first chunks take 50 ms to a minute): a
new endpoint is tried as soon as its load says so (first among equal costs), and
its first answer places it. With no estimate among them, the endpoints are ranked by load alone, as
without ``LatencyRouting``.

No lock here: ``EndpointPicker`` (``_policies/routing/picker.py``) reads and
feeds the estimates under its own. O(1) memory: two floats per estimate.
"""

from __future__ import annotations

import math

__all__ = ["MIN_TOKENS", "PeakEwma", "peak_cost", "token_sample"]

#: The fewest completion tokens a plain call's latency is divided by (see above).
MIN_TOKENS = 16


class PeakEwma:
    """One endpoint's peak-sensitive, time-weighted moving average of one kind of
    latency sample (seconds). Not thread-safe on its own."""

    __slots__ = ("at", "value")

    def __init__(self, sample: float, now: float) -> None:
        #: The estimate as of the last sample, and when that sample came.
        self.value = sample
        self.at = now

    def estimate(self, now: float, decay: float) -> float:
        """The estimate now: decayed toward zero since the last sample."""
        return self.value * math.exp(-max(now - self.at, 0.0) / decay)

    def observe(self, sample: float, now: float, decay: float, *, lower_bound: bool) -> None:
        """Add a sample taken at ``now``. A ``lower_bound`` (the latency was more
        than ``sample``) only raises the estimate as read now, never lowers it."""
        if lower_bound:
            if sample > self.estimate(now, decay):
                self.value, self.at = sample, now
            return
        if sample >= self.value:
            self.value = sample  # the peak: at once
        else:
            weight = math.exp(-max(now - self.at, 0.0) / decay)
            self.value = self.value * weight + sample * (1.0 - weight)
        self.at = now


def peak_cost(score: float, weight: float, latency: float) -> float:
    """Peak EWMA's cost of one more call: ``(load + 1) * latency`` per unit of
    weight, ``score`` being the load per unit of weight (``EndpointState.score``)."""
    return (score + 1.0 / weight) * latency


def token_sample(seconds: float, completion_tokens: int) -> float:
    """A plain call's sample: its latency per completion token, at least
    ``MIN_TOKENS`` of them."""
    return seconds / max(completion_tokens, MIN_TOKENS)
