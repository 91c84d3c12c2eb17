"""The clients under test, each configured the way an application would.

- ``openai``: ``openai.AsyncOpenAI`` as it comes (2 retries, 0.5-8 s backoff);
  the caller's timeout is its ``timeout``, which openai applies to each attempt.
- ``openai+tenacity``: the same client inside the retry decorator found in most
  tutorials: 5 attempts, exponential wait 1, 2, 4, 8 s, on any exception.
- ``stormguard``: ``stormguard.AsyncClient`` with its default policy; the caller's
  timeout is its ``timeout``, the total of all attempts.
- ``openai+sg-httpx``: ``openai.AsyncOpenAI(max_retries=0)`` on
  ``stormguard.async_httpx_client`` (stormguard's whole pipeline as the transport).
- ``litellm``: ``litellm.acompletion(model="openai/...", num_retries=2, timeout=...)``.
- ``litellm-router``: ``litellm.Router(num_retries=2, timeout=...)``, one deployment
  per server (one server; every replica in the fleet).

The avalanche runs the first three (``AVALANCHE_CLIENTS``), the burst and the rebound
all of them, the fleet three over several replicas (``fleet/clients.py``). LiteLLM is
imported lazily, offline (``LITELLM_LOCAL_MODEL_COST_MAP``: otherwise its import
fetches a model cost map from the internet), so the drill works without it:
``unavailable()`` says why a client cannot run, and the drill skips it.

Every call streams (time to first token is measured at the first chunk) and asks
for the usage chunk, whose completion tokens are what goodput counts. Attempts
are counted where each client sends them: an httpx request hook for openai,
``client.stats()`` for stormguard and its transport; LiteLLM's are counted at the
server only (``attempts()`` is None), which is where every client's are comparable.

Where each lives: the names, the ``DrillClient`` protocol and ``CallOutcome`` in
``drill_client.py``; the openai-python ones in ``openai_clients.py``, stormguard's in
``stormguard_client.py`` (its figures in ``stormguard_figures.py``), LiteLLM's in
``litellm_client.py``; ``make_client()`` by name in ``registry.py``. What they measure
of a call: ``stream_tally.py``; which replica each attempt went to (the fleet's
record): ``attempt_log.py``. The fleet's, the quota's and the outage's clients are
built on these in their own subpackages (``fleet/clients.py``, ``quota/clients.py``,
``outage/clients.py``). This package's ``__init__`` imports nothing: import each name
from the module that defines it.
"""
