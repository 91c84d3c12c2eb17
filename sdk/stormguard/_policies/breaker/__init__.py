"""A circuit breaker per (endpoint, model): stop calling a server that keeps failing.

Retries and their budget bound how much extra load one failing call adds; the
breaker stops the first attempts too. The OOM-avalanche incident's stop-loss order takes the
OOM-looping instance out of rotation before anything else can recover: a
server that crashes, restarts cold and crashes again is only kept down by
clients that keep sending it work. An open breaker sends it nothing, and the
half-open probes bring traffic back a little at a time once it is healthy.

What counts against a breaker is one rule, ``Verdict.breaker_failure`` of
``_core/verdict.py``'s ``classify``: crash-like failures only (refused or timed-out
connections, 5xx but 503, 408, a stream cut before its first chunk, a broken 2xx
body), never a shed, a 429, the caller's own error or a refusal made here. The
modules:

* ``config.py``: ``BreakerConfig``, when a breaker trips and how it
  recovers, with the reasons for each default;
* ``circuit.py``: ``CircuitBreaker``, the states and their changes,
  and ``Permit``, one call's leave to go through;
* ``registry.py``: ``BreakerRegistry``, one breaker per (endpoint,
  model), bounded in number;
* ``states.py``: ``CircuitState``, and what a breaker hands out:
  ``BreakerTransition`` to listeners, ``BreakerSnapshot`` on request.

A listener that raises is logged by the logger ``stormguard._breaker`` (the name
documented in docs/breakers.md, kept by ``circuit.py``).
"""
