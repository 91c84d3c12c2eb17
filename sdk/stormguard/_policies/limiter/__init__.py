"""Adaptive concurrency per endpoint: the calls a server cannot hold wait here. The
limiter and what an outcome tells a limit (``limiter``), how a limit moves
(``aimd``), one endpoint's limit and local queue (``endpoint_limit``), a slot held by
an attempt (``lease``), and a call waiting for one (``slot_waiter``).
"""
