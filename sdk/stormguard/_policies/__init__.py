"""Policies that decide whether and when a call goes out, one package each.

Each is a small set of modules with one job apiece, testable alone with an
injected clock, thread-safe, and free of I/O: a policy returns waits, the call
flow sleeps them (``call_flow.Sleep``): ``retry/`` (which failures, when, and
the budget), ``breaker/``, ``limiter/`` (concurrency per endpoint), ``routing/``
(which server, ejection, discovery), ``quota/`` (a hosted API's per-key quota), and
``fallback`` (which model next).
"""
