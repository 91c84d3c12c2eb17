"""The fleet's targets (``FleetTargets``) checked against one pairing's figures, and
the p99 target against LiteLLM Router's p99 once every pairing is summarized."""

from __future__ import annotations

from typing import Any

from stormguard_drill.fleet.config import FleetTargets

ROUTER = "litellm-router"


def missed(checks: dict[str, dict[str, Any]]) -> list[str]:
    """The names of the targets not met."""
    return [name for name, check in checks.items() if not check["met"]]


def check_fleet_targets(figures: dict[str, Any], targets: FleetTargets) -> dict[str, Any]:
    """Each target's bound, the measured figure, and whether it was met (a figure not
    measured does not meet its target); the p99 target waits for the Router's row."""
    dead = figures["sick_share"].get("dead") or {}
    bounds: list[tuple[str, str, float | None, float, bool]] = [
        ("success", "success_rate", figures["success_rate"], targets.min_success, True),
        (
            "attempts/call",
            "retry_amplification_server",
            figures["retry_amplification_server"],
            targets.max_attempts_per_call,
            False,
        ),
        ("dead share", "sick_share.dead.share", dead.get("share"), targets.max_dead_share, False),
    ]
    checks: dict[str, Any] = {}
    for name, key, value, bound, at_least in bounds:
        met = value is not None and (value >= bound if at_least else value <= bound)
        checks[name] = {"figure": key, "bound": bound, "measured": value, "met": met}
    checks["p99 vs router"] = {
        "figure": "latency_p99_s / litellm-router's",
        "bound": targets.max_p99_over_router,
        "measured": None,
        "met": False,
    }
    return checks


def compare_with_router(pairings: list[dict[str, Any]]) -> None:
    """Fill in each pairing's p99 target against LiteLLM Router's p99 of the same server
    mode (no Router row: not measured, not met), and its ``missed`` list."""
    router_p99 = {p["admission"]: p["latency_p99_s"] for p in pairings if p["client"] == ROUTER}
    for p in pairings:
        check = p["targets"]["p99 vs router"]
        theirs, mine = router_p99.get(p["admission"]), p["latency_p99_s"]
        ratio = None if not theirs or mine is None else round(mine / theirs, 3)
        check["measured"] = ratio
        check["met"] = ratio is not None and ratio <= check["bound"]
        p["missed"] = missed(p["targets"])
