"""The LiteLLM clients: ``litellm`` (``litellm.acompletion`` with 2 retries) and
``litellm-router`` (a ``litellm.Router`` with 2 retries, one deployment per server).

LiteLLM is imported lazily, offline (``LITELLM_LOCAL_MODEL_COST_MAP``: otherwise its
import fetches a model cost map from the internet), so the drill works without it.
Its attempts are counted at the server only (``attempts()`` is None).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any

from stormguard_drill.clients.drill_client import (
    API_KEY,
    MODEL,
    CallOutcome,
    ClientName,
    ClientUnavailable,
)
from stormguard_drill.clients.stream_tally import StreamTally, whole_answer
from stormguard_drill.workload import Arrival

_LITELLM_RETRIES = 2


def import_litellm() -> Any:
    """LiteLLM, imported offline and quiet; ``ClientUnavailable`` where it cannot be."""
    # Before the import: without it, importing litellm fetches a model cost map from
    # the internet (this drill sends traffic to 127.0.0.1 only).
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        litellm: Any = importlib.import_module("litellm")
    except Exception as exc:  # ImportError, or an import that breaks in this environment
        raise ClientUnavailable(
            f"litellm cannot be imported ({type(exc).__name__}: {exc});"
            " pip install litellm to run the LiteLLM clients"
        ) from exc
    litellm.suppress_debug_info = True
    if hasattr(litellm, "telemetry"):
        litellm.telemetry = False
    return litellm


class LiteLLMClient:
    """``litellm.acompletion`` with 2 retries, or a ``litellm.Router`` with 2 retries
    over one deployment per server of ``base_url`` (one, or several: the fleet); the
    caller's timeout is LiteLLM's ``timeout``.

    The quota scenario sets more of the Router: ``num_retries=None`` leaves LiteLLM's
    default, ``deployment`` adds to each deployment's ``litellm_params`` (its ``tpm`` and
    ``rpm``), ``router_options`` to the Router's own arguments (its routing strategy, its
    Redis settings), and ``stream=False`` asks for whole answers."""

    def __init__(
        self,
        base_url: str | Sequence[str],
        timeout_s: float,
        *,
        router: bool,
        num_retries: int | None = _LITELLM_RETRIES,
        deployment: dict[str, Any] | None = None,
        router_options: dict[str, Any] | None = None,
        stream: bool = True,
    ) -> None:
        self.name: ClientName = "litellm-router" if router else "litellm"
        self._litellm = import_litellm()
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self._base_url = urls[0]
        self._timeout_s = timeout_s
        self._stream = stream
        self._router: Any = None
        if router:
            deployments = [
                {
                    "model_name": MODEL,
                    "litellm_params": {
                        "model": f"openai/{MODEL}",
                        "api_base": url,
                        "api_key": API_KEY,
                        **(deployment or {}),
                    },
                }
                for url in urls
            ]
            options: dict[str, Any] = {"timeout": timeout_s, **(router_options or {})}
            if num_retries is not None:
                options["num_retries"] = num_retries
            self._router = self._litellm.Router(model_list=deployments, **options)
        elif len(urls) > 1:
            raise ValueError("litellm.acompletion takes one server: use the Router for several")

    def attempts(self) -> int | None:
        return None  # counted at the server

    def gauges(self) -> dict[str, float]:
        return {}

    def stats(self) -> dict[str, float]:
        return {}

    async def call(self, arrival: Arrival) -> CallOutcome:
        tally = StreamTally()
        request: dict[str, Any] = {"messages": arrival.messages, "max_tokens": arrival.max_tokens}
        if self._stream:
            request.update(stream=True, stream_options={"include_usage": True})
        try:
            if self._router is not None:
                answer = await self._router.acompletion(model=MODEL, **request)
            else:
                answer = await self._litellm.acompletion(
                    model=f"openai/{MODEL}",
                    api_base=self._base_url,
                    api_key=API_KEY,
                    num_retries=_LITELLM_RETRIES,
                    timeout=self._timeout_s,
                    **request,
                )
            if not self._stream:
                return whole_answer(answer)
            async for chunk in answer:
                tally.saw(chunk)
        except Exception as exc:  # LiteLLM's errors subclass openai's, and more
            return CallOutcome(ok=False, error=type(exc).__name__)
        return tally.outcome()

    async def aclose(self) -> None:
        return None  # LiteLLM caches its HTTP clients per api_base; a dead port's idle
