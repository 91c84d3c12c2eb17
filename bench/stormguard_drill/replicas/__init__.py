"""The replicas scenario (``stormguard-drill --scenario replicas``): where a call goes
among several replicas of one model, and what that costs.

Three reference-server replicas, automatic prefix caching on, each pairing on fresh
ones (caches cold); two parts, one pairing at a time, since both time the first token:

- **affinity**: multi-turn conversations over a few long shared system prompts
  (``conversations.py``, the workload of ``bench/bench_affinity.py``), at most
  ``in_flight`` turns at once, each replica's KV cache ``kv_share`` of all their
  distinct prompt tokens. Clients: ``stormguard`` (as it comes),
  ``stormguard-affinity`` (``AffinityPolicy()``, keyed by conversation),
  ``litellm-router`` (least-busy). Figures: prefill tokens computed (the replicas'
  ``stormguard_engine_prefill_tokens_total``) and the prefix cache's hit rate
  (``vllm:prefix_cache_hits/queries_total``), TTFT p50/p99, requests per replica over
  its fair share, success within the deadline, requests at the replicas per call;
- **hedging**: short streamed calls at ``rate`` a second, distinct prompts; the last
  replica answers ``slow_ms`` later during the middle window (its admin endpoint's
  ``added_latency_ms``). Clients: ``stormguard``, ``stormguard-hedge``
  (``HedgePolicy()``), ``stormguard-hedge-latency`` (``HedgePolicy()`` and
  ``LatencyRouting()``), ``litellm-router``. Figures: TTFT p99 (all calls, and those
  started in the slow window), requests at the replicas per call, hedges sent and won,
  tokens generated for losers (``stormguard_gone_client_tokens_total``: generated for
  requests whose client had gone).

Claims (``summary.check_targets``): affinity computes fewer prefill tokens than the
default client; hedging's TTFT p99 is below the default client's with at most 1.1
requests a call; every client completes its calls within their deadline.

Its modules, from the top: ``drill.py`` (every pairing, the KV sizing, the JSON
document), ``runner.py`` (one pairing: the replicas, the replay, the slow window, the
counters), ``summary.py`` (the figures and the claims), ``records.py`` (what a pairing
measured), ``clients.py``, ``config.py`` (the engine, the loads, the presets),
``conversations.py`` (the affinity workload).
"""
