"""Ejection's settings: when an endpoint leaves rotation and how it comes back.

Each default carries its reason beside it; ``_policies/routing/ejection.py`` says how the
tracker uses them, ``_policies/routing/ejection_rules.py`` the rules they tune, and
docs/breakers.md has the table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["ConnectProbe", "EjectionConfig"]

#: ``(host, port, timeout) -> reachable``: how a connect check is made.
ConnectProbe = Callable[[str, int, float], bool]


@dataclass(frozen=True, kw_only=True)
class EjectionConfig:
    """When an endpoint leaves rotation and how it comes back (docs/breakers.md).

    >>> EjectionConfig().base_ejection_time, EjectionConfig().max_ejected_share
    (10.0, 0.5)
    >>> EjectionConfig(consecutive_failures=None, probe="call").probe
    'call'
    """

    #: gRPC's connection backoff (doc/connection-backoff.md): the first connect check
    #: comes ``reconnect_backoff`` after the endpoint was found unreachable, each
    #: failed one multiplies the wait by ``reconnect_multiplier``, +-``reconnect_jitter``,
    #: up to ``max_reconnect_backoff`` (gRPC's 120 s would leave a restarted replica
    #: idle for up to two minutes; a TCP connect every 5 s costs a server nothing).
    reconnect_backoff: float = 1.0
    reconnect_multiplier: float = 1.6
    reconnect_jitter: float = 0.2
    max_reconnect_backoff: float = 5.0
    #: ``"connect"``: a TCP connect decides whether an unreachable endpoint is back
    #: (no call is sent to it before). ``"call"``: the first call after the backoff
    #: is the probe. Or a function ``(host, port, timeout) -> reachable``.
    probe: Literal["connect", "call"] | ConnectProbe = "connect"
    #: Seconds a connect check may take (it runs in a thread: no call waits for it).
    probe_timeout: float = 5.0
    #: Crash-like failures in a row that eject (Envoy's ``consecutive_5xx``); None: off.
    consecutive_failures: int | None = 5
    #: The window of the success-rate rule, in seconds (Envoy's ``interval``).
    interval: float = 10.0
    #: Calls in the window below which an endpoint is not judged (nor compared with).
    min_requests: int = 10
    #: Envoy's ``success_rate_stdev_factor`` (1900 / 1000).
    stdev_factor: float = 1.9
    #: The least gap below the others' mean success rate that ejects.
    success_rate_margin: float = 0.3
    #: False turns the success-rate rule off.
    success_rate: bool = True
    #: Envoy's failure-percentage rule (LiteLLM's cooldown at 50 % failures): a
    #: deployment failing this share of at least ``min_requests`` calls in the
    #: window is ejected, when a later tier serves its models (docs/providers.md);
    #: None turns it off. Plain endpoints are judged by the rules above only.
    failure_rate: float | None = 0.5
    base_ejection_time: float = 10.0
    max_ejection_time: float = 120.0
    #: An ejection is lengthened by up to this share (never shortened), so that the
    #: clients a fault ejected together do not all return in the same second.
    jitter: float = 0.1
    #: Ejections on failures may take out at most this share of the endpoints (one
    #: always may, but never the last of a model).
    max_ejected_share: float = 0.5
    #: Successes that end an endpoint's probation after it returns.
    probation_successes: int = 2

    def __post_init__(self) -> None:
        for name in (
            "reconnect_backoff",
            "max_reconnect_backoff",
            "probe_timeout",
            "interval",
            "base_ejection_time",
            "max_ejection_time",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.max_reconnect_backoff < self.reconnect_backoff:
            raise ValueError("max_reconnect_backoff must be >= reconnect_backoff")
        if self.max_ejection_time < self.base_ejection_time:
            raise ValueError("max_ejection_time must be >= base_ejection_time")
        if not (math.isfinite(self.reconnect_multiplier) and self.reconnect_multiplier >= 1):
            raise ValueError("reconnect_multiplier must be a finite number >= 1")
        for name in ("reconnect_jitter", "jitter"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value < 1):
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if not (math.isfinite(self.max_ejected_share) and 0 <= self.max_ejected_share <= 1):
            raise ValueError("max_ejected_share must be in [0, 1]")
        if self.consecutive_failures is not None and self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be at least 1 (or None for off)")
        if self.min_requests < 1 or self.probation_successes < 0:
            raise ValueError("min_requests must be >= 1 and probation_successes >= 0")
        if not (math.isfinite(self.stdev_factor) and self.stdev_factor >= 0):
            raise ValueError("stdev_factor must be a finite number >= 0")
        if not (math.isfinite(self.success_rate_margin) and 0 < self.success_rate_margin <= 1):
            raise ValueError("success_rate_margin must be in (0, 1]")
        rate = self.failure_rate
        if rate is not None and not (
            isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate <= 1
        ):
            raise ValueError(f"failure_rate must be in (0, 1] or None, got {rate!r}")
        if not (self.probe in ("connect", "call") or callable(self.probe)):
            raise ValueError('probe must be "connect", "call" or a function (host, port, timeout)')
