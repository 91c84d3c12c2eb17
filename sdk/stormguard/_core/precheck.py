"""``Precheck``: what a token pre-check found, a frozen record and nothing else.

``TokenPolicy`` (``tokens/_policy.py``) makes one; the call's result and its errors
(``StormguardError.precheck``) carry it. It lives apart from the policy, with the
other records, so that the exception tree and the results can name it without
reaching the counters and the limiter.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

__all__ = ["Precheck"]


@dataclass(frozen=True)
class Precheck:
    """What the pre-check found: the request fits (or its context window is unknown)."""

    #: The model to call: the requested one, or its fallback with a larger context window.
    model: str
    prompt_tokens: int
    #: The request's ``max_tokens``, or the default completion length.
    max_tokens: int
    #: None when no source knows the context window: then nothing was checked.
    context_window: int | None
    #: Name of the counter that counted (``"tiktoken:o200k_base"``...).
    counter: str
    #: The requested model when ``model`` is its context-window fallback.
    fallback_from: str | None = None
    #: Where the context window came from: ``"config"``, ``"server"`` or ``"table"``.
    context_window_source: str | None = None

    @property
    def cost(self) -> int:
        """The request's token cost: prompt tokens plus max_tokens."""
        return self.prompt_tokens + self.max_tokens

    @property
    def window_source(self) -> str | None:
        """Deprecated name of :attr:`context_window_source`."""
        warnings.warn(
            "Precheck.window_source is deprecated; use Precheck.context_window_source",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.context_window_source
