"""Token counting, context-window pre-checks and a client-side token rate limit.

The pipeline runs :meth:`TokenPolicy.precheck_flow` before any attempt; the flow
is I/O-free and driven by :func:`run_precheck_sync` or :func:`run_precheck_async`.
Counting works offline: the BPE files come from an installed package and are
checked against tiktoken's own hashes (see docs/tokens.md).
"""

from __future__ import annotations

from ._bpe import BPE_DISTRIBUTION, BPEFileError, bpe_directories, offline_encoding
from ._chat import CONSERVATIVE_OVERHEAD, OPENAI_OVERHEAD, ChatOverhead, count_chat_tokens
from ._counter import Message, TokenCounter, Tool
from ._estimate import EstimatingCounter
from ._flow import Flow, run_precheck_async, run_precheck_sync
from ._hf_counter import HuggingFaceCounter
from ._match import ModelMap
from ._models import encoding_name_for_model
from ._policy import DEFAULT_MAX_TOKENS, Precheck, TokenPolicy
from ._rate_limit import Reservation, TokenRateLimiter
from ._server_counter import ServerTokenizeCounter, TokenCount
from ._tiktoken_counter import TiktokenCounter
from ._windows import KNOWN_CONTEXT_WINDOWS, known_context_window

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
