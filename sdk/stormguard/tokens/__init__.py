"""Token counting, context-window pre-checks and a client-side token rate limit.

A client's call runs :meth:`TokenPolicy.precheck_flow` before its first attempt
(``_call/call_precheck.py``); the flow is I/O-free, and the call's driver does its
lookups within the call's deadline. On its own a flow is driven by
:func:`run_precheck_sync` or :func:`run_precheck_async`.
Counting works offline: the BPE files come from an installed package and are
checked against tiktoken's own hashes (see docs/tokens.md).

Each name loads its module on first use (PEP 562), so that ``import stormguard``
(and a client with no pre-check) never imports tiktoken, its model tables or
the known context windows: they load when a pre-check that needs them runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._core.precheck import Precheck
    from ._bpe import BPE_DISTRIBUTION, BPEFileError, bpe_directories, offline_encoding
    from ._chat import CONSERVATIVE_OVERHEAD, OPENAI_OVERHEAD, ChatOverhead, count_chat_tokens
    from ._context_windows import KNOWN_CONTEXT_WINDOWS, known_context_window
    from ._counter import Message, TokenCounter, Tool
    from ._estimate import EstimatingCounter
    from ._flow import Flow, run_precheck_async, run_precheck_sync
    from ._hf_counter import HuggingFaceCounter
    from ._match import ModelMap
    from ._models import encoding_name_for_model
    from ._policy import DEFAULT_MAX_TOKENS, TokenPolicy
    from ._rate_limit import Reservation, TokenRateLimiter
    from ._server_counter import ServerTokenizeCounter, TokenCount
    from ._tiktoken_counter import TiktokenCounter

__all__ = [
    "BPE_DISTRIBUTION",
    "CONSERVATIVE_OVERHEAD",
    "DEFAULT_MAX_TOKENS",
    "KNOWN_CONTEXT_WINDOWS",
    "OPENAI_OVERHEAD",
    "BPEFileError",
    "ChatOverhead",
    "EstimatingCounter",
    "Flow",
    "HuggingFaceCounter",
    "Message",
    "ModelMap",
    "Precheck",
    "Reservation",
    "ServerTokenizeCounter",
    "TiktokenCounter",
    "TokenCount",
    "TokenCounter",
    "TokenPolicy",
    "TokenRateLimiter",
    "Tool",
    "bpe_directories",
    "count_chat_tokens",
    "encoding_name_for_model",
    "known_context_window",
    "offline_encoding",
    "run_precheck_async",
    "run_precheck_sync",
]

#: Public name -> the submodule that defines it.
_SUBMODULES = {
    "BPE_DISTRIBUTION": "._bpe",
    "BPEFileError": "._bpe",
    "bpe_directories": "._bpe",
    "offline_encoding": "._bpe",
    "CONSERVATIVE_OVERHEAD": "._chat",
    "OPENAI_OVERHEAD": "._chat",
    "ChatOverhead": "._chat",
    "count_chat_tokens": "._chat",
    "Message": "._counter",
    "TokenCounter": "._counter",
    "Tool": "._counter",
    "EstimatingCounter": "._estimate",
    "Flow": "._flow",
    "run_precheck_async": "._flow",
    "run_precheck_sync": "._flow",
    "HuggingFaceCounter": "._hf_counter",
    "ModelMap": "._match",
    "encoding_name_for_model": "._models",
    "DEFAULT_MAX_TOKENS": "._policy",
    "Precheck": ".._core.precheck",
    "TokenPolicy": "._policy",
    "Reservation": "._rate_limit",
    "TokenRateLimiter": "._rate_limit",
    "ServerTokenizeCounter": "._server_counter",
    "TokenCount": "._server_counter",
    "TiktokenCounter": "._tiktoken_counter",
    "KNOWN_CONTEXT_WINDOWS": "._context_windows",
    "known_context_window": "._context_windows",
}


def __getattr__(name: str) -> Any:
    module = _SUBMODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
