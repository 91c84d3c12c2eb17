"""A circuit breaker per (endpoint, model): stop calling a server that keeps failing.

Retries and their budget bound how much extra load one failing call adds; the
breaker stops the first attempts too. The OOM-avalanche incident's stop-loss order takes the
OOM-looping instance out of rotation before anything else can recover: a
server that crashes, restarts cold and crashes again is only kept down by
clients that keep sending it work. An open breaker sends it nothing, and the
half-open probes bring traffic back a little at a time once it is healthy.

This module holds the rule of what counts against a breaker
(``is_breaker_failure``). The pieces live beside it, each imported from its own
module:

* ``_policies/breaker/config.py``: ``BreakerConfig``, when a breaker trips and how it
  recovers, with the reasons for each default;
* ``_policies/breaker/circuit.py``: ``CircuitBreaker``, the states and their changes,
  and ``Permit``, one call's leave to go through;
* ``_policies/breaker/registry.py``: ``BreakerRegistry``, one breaker per (endpoint,
  model), bounded in number;
* ``_policies/breaker/states.py``: ``CircuitState``, and what a breaker hands out:
  ``BreakerTransition`` to listeners, ``BreakerSnapshot`` on request.

A listener that raises is logged by the logger ``stormguard._breaker`` (the name
documented in docs/breakers.md, kept by ``_policies/breaker/circuit.py``).
"""

from __future__ import annotations

from ..._core.verdict import classify

__all__ = ["is_breaker_failure"]


def is_breaker_failure(error: BaseException | None) -> bool:
    """Whether an attempt's outcome says the server is unwell (None: it succeeded):
    crash-like failures only (refused or timed-out connections, 5xx but 503, 408,
    a stream cut before its first chunk, a broken 2xx body), never a shed, a 429,
    the caller's own error or a refusal made here. The rule and its reasons live
    in ``_verdict.classify`` (``Verdict.breaker_failure``).

    >>> is_breaker_failure(None)
    False
    """
    return classify(error).breaker_failure
