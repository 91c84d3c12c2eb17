"""The drill: the OOM avalanche reproduced on the reference server, then defeated.

Every client (openai-python with its default retries, openai-python inside a
tenacity retry, stormguard) meets every server (admission off, admission on)
under the same seeded workload: steady Poisson load of short prompts, a burst
of very long prompts, then steady load again. Two more scenarios
(``--scenario``): ``burst``, 300 short calls at once against a server that sheds,
and ``rebound``, an engine crash while a backlog of calls waits, then what comes
back after the cold start; both also with openai-python on stormguard's httpx
transport and with LiteLLM. ``fleet``: a partial outage of several replicas under
several client processes. ``quota``: a batch job of several processes on one API key
against a hosted API's quota (OpenAI's 429s, Retry-After, ``x-ratelimit-*``), every
client side by side, LiteLLM's Router with Redis included. ``replicas``: prefix-cache
affinity and hedged requests over three replicas whose engine caches prefixes.
``stormguard-drill --help``.

It is a package of its own, beside the server rather than inside it: it drives
``stormguard_server`` processes and borrows a few of its pieces (the tiny model
builder, the vLLM environment check, the admin token's variable), while the server
imports nothing from it, so a server install carries no benchmark harness. It is
installed with the distribution so that the ``stormguard-drill`` console script works
from any install with the ``bench`` extra; ``bench/drill.py`` is a thin launcher for a
checkout.
"""
