"""The quota scenario (``stormguard-drill --scenario quota``): a batch job of several
processes on one API key against a hosted API's quota (OpenAI's 429s, Retry-After,
``x-ratelimit-*``), every client side by side, LiteLLM's Router with Redis included
(``config.py`` says what the variants are).

Its modules, from the top: ``drill.py`` (every client x every variant, the JSON
document); ``runner.py`` (one pairing: a fresh server, the worker processes, the
server's counts), ``worker.py`` (one worker process, ``python -m
stormguard_drill.quota.worker``, its threads or tasks) and ``clients.py`` (the clients
as the quota asks); ``summary.py`` (the figures and targets); ``records.py`` (what a
pairing measured), ``client_names.py`` and ``config.py`` at the bottom. The figures
read the records, never the runner.
"""
