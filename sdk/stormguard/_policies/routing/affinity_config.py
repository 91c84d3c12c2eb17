"""Prefix-cache affinity's settings (``AffinityPolicy``), checked when made;
``_policies/routing/affinity.py`` has the ranking, the bound and the key, and
docs/resilience.md ("Prefix-cache affinity") the guide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .affinity import DEFAULT_EPSILON, DEFAULT_PREFIX_CHARS, DEFAULT_SLACK, key_of

__all__ = ["DEFAULT_AFFINITY", "AffinityPolicy", "checked_affinity"]


@dataclass(frozen=True, kw_only=True)
class AffinityPolicy:
    """Send calls that share a prompt prefix to the same endpoint of several, so
    that its prefix cache serves them (docs/resilience.md, "Prefix-cache affinity").

    A call with a key goes to the key's endpoint (weighted rendezvous hashing over
    the endpoints' names) while that endpoint holds less than ``1 + epsilon`` times
    its fair share of this client's calls in flight, or that share plus ``slack``
    calls (whichever is more: the slack is what keeps keys home when few calls
    are in flight), does not shed and is in rotation; else to the key's next
    endpoint, and with none, by load as any call. A key that left a full home
    moves: this client sends its later calls first where that call went.
    The key is the body's ``prompt_cache_key``; with ``derive_from_prompt``, a call
    without one takes the start of its prompt (at most ``prefix_chars``
    characters: chat messages through the first user message, the start of a
    completion's ``prompt`` or a response's ``input``).

    >>> AffinityPolicy().epsilon, AffinityPolicy().slack, AffinityPolicy().derive_from_prompt
    (0.25, 2, False)
    >>> AffinityPolicy(derive_from_prompt=True, prefix_chars=4096).prefix_chars
    4096
    """

    #: How far over its fair share of this client's calls in flight an endpoint may
    #: go before a key's calls move on to its next endpoint (bounded loads; 0.25:
    #: at most 1.25 times the share).
    epsilon: float = DEFAULT_EPSILON
    #: Calls in flight an endpoint may hold above its fair share however few are in
    #: flight (2: at 6 calls over two endpoints, 5 may go to one home, not 4).
    slack: int = DEFAULT_SLACK
    #: Derive a key from the prompt's start for calls that give no ``prompt_cache_key``.
    derive_from_prompt: bool = False
    #: How much of a prompt a derived key reads (and of a ``prompt_cache_key``).
    prefix_chars: int = DEFAULT_PREFIX_CHARS

    def __post_init__(self) -> None:
        epsilon = self.epsilon
        if (
            isinstance(epsilon, bool)
            or not isinstance(epsilon, (int, float))
            or not (math.isfinite(epsilon) and epsilon > 0)
        ):
            raise ValueError(
                f"epsilon must be a positive finite number (0.25: at most 1.25 times an"
                f" endpoint's share), got {epsilon!r}"
            )
        slack = self.slack
        if isinstance(slack, bool) or not isinstance(slack, int) or slack < 0:
            raise ValueError(
                f"slack must be a whole number of calls >= 0 (0: epsilon alone), got {slack!r}"
            )
        if not isinstance(self.derive_from_prompt, bool):
            raise TypeError(
                f"derive_from_prompt must be True or False, got {self.derive_from_prompt!r}"
            )
        chars = self.prefix_chars
        if isinstance(chars, bool) or not isinstance(chars, int) or chars < 1:
            raise ValueError(f"prefix_chars must be an integer >= 1, got {chars!r}")

    def key_of(self, body: Mapping[str, Any] | None) -> bytes | None:
        """The affinity key of a call with this body (None: it goes by load)."""
        return key_of(body, derive=self.derive_from_prompt, prefix_chars=self.prefix_chars)


#: A client's default: a call's own ``prompt_cache_key`` picks its endpoint of
#: several (OpenAI routes on it too); no key is derived from a prompt.
DEFAULT_AFFINITY = AffinityPolicy()


def checked_affinity(value: object) -> AffinityPolicy | None:
    """``value`` as the ``affinity`` option: an ``AffinityPolicy`` or None."""
    if value is not None and not isinstance(value, AffinityPolicy):
        raise TypeError(
            f"affinity must be a stormguard.AffinityPolicy or None, got {type(value).__name__}"
        )
    return value
