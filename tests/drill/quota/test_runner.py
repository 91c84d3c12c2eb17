"""The quota drill goes on past a broken pairing: it is tried once more, then left
out with its error, and every other pairing's figures are kept as they end."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from stormguard_drill.quota import runner as quota_runner
from stormguard_drill.quota.config import QuotaVariant, quota_preset


def test_a_pairing_that_fails_twice_is_left_out_and_the_rest_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tries: list[str] = []

    async def pairing(
        servers: Any, config: Any, client: str, variant: QuotaVariant, *rest: Any
    ) -> Any:
        tries.append(client)
        if client == "openai" or (client == "stormguard-async" and tries.count(client) == 1):
            raise RuntimeError("can't start new thread")
        return client

    monkeypatch.setattr(quota_runner, "run_quota_pairing", pairing)
    config = quota_preset("full")
    variant = QuotaVariant(processes=1)
    pairs = [(variant, c) for c in ("stormguard-sync", "openai", "stormguard-async")]
    failed: dict[str, str] = {}
    heard: list[Any] = []
    runs = asyncio.run(
        quota_runner.run_quota_pairings(
            None,
            config,
            pairs,
            [],
            None,
            tmp_path,
            failed,
            heard.append,  # type: ignore[arg-type]
        )
    )
    assert runs == heard == ["stormguard-sync", "stormguard-async"]  # the second try held
    assert tries.count("openai") == 2
    assert failed == {f"{variant.name} / openai": "RuntimeError: can't start new thread"}
