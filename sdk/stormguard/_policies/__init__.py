"""Policies that decide whether and when a call goes out, one package each.

Each is a small set of modules with one job apiece, testable alone with an
injected clock, thread-safe, and with no I/O on a call's path: a policy returns
waits, the call flow sleeps them (``call_flow.Sleep``), and a shared quota's
Redis round trip is an action the driver performs (``quota/_shared.py``); DNS
lookups and connect checks run in threads of their own. ``retry/`` (which
failures, when, and the budget), ``breaker/``, ``limiter/`` (concurrency per
endpoint), ``routing/`` (which server, ejection, discovery), ``quota/`` (a hosted
API's per-key quota), and ``fallback`` (which model next).
"""
