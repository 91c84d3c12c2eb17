"""The fleet's PNG plots over time: per replica, one panel per pairing.

- ``attempts_per_replica.png``: attempts/s each replica counted (its /metrics, 1 s
  bins; a gap while the dead one had no process);
- ``client_attempts_per_replica.png``: attempts/s the client processes sent to each
  replica (their records, 1 s bins: refused connections to the dead one included);
- ``successes_per_s.png``: successful logical requests/s, one line per pairing;
- ``replica_states.png``: each replica's state (healthy, slow, restarting, dead).

Dotted lines mark the faults' starts and the recovery. Same size and palette as the
other scenarios' plots (``plots.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.patches import Rectangle

from stormguard_drill.plots import CLIENT_COLORS, shrink_png

# After plots.py, which selects the Agg backend.
import matplotlib.pyplot as plt  # isort: skip

_STATE_COLORS = {
    "healthy": "tab:green",
    "slow": "gold",
    "restarting": "tab:orange",
    "dead": "tab:red",
}
_REPLICA_COLORS = ("tab:red", "tab:purple", "goldenrod", "tab:green", "tab:blue", "tab:brown")


def _label(pairing: dict[str, Any]) -> str:
    return f"{pairing['client']}, admission {pairing['admission']}"


def _marks(ax: Any, marks: Sequence[tuple[float, str]]) -> None:
    for t, _ in marks:
        ax.axvline(t, color="0.5", linestyle=":", linewidth=1)


def _replica_name(pairing: dict[str, Any], index: int) -> str:
    fault = pairing["replicas"][index]["fault"]
    return f"r{index} ({fault.replace('_', ' ')})" if fault else f"r{index}"


def _per_replica(
    pairings: Sequence[dict[str, Any]],
    key: str,
    ylabel: str,
    marks: Sequence[tuple[float, str]],
    path: Path,
) -> Path:
    fig, axes = plt.subplots(
        len(pairings), 1, figsize=(8, 2.3 * len(pairings) + 0.6), dpi=80, squeeze=False
    )
    for ax, pairing in zip(axes[:, 0], pairings, strict=True):
        _marks(ax, marks)
        for index, points in pairing["timeseries"][key].items():
            if not points:
                continue
            xs = [x for x, _ in points]
            ys = [math.nan if y is None else y for _, y in points]  # a gap: not sampled
            color = _REPLICA_COLORS[int(index) % len(_REPLICA_COLORS)]
            ax.plot(xs, ys, color=color, linewidth=1.1, label=_replica_name(pairing, int(index)))
        ax.set_title(_label(pairing), fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the pairing started")
    return _save(fig, path)


def _successes(
    pairings: Sequence[dict[str, Any]], marks: Sequence[tuple[float, str]], path: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
    _marks(ax, marks)
    for pairing in pairings:
        points = pairing["timeseries"]["successes_per_s"]
        if points:
            xs, ys = zip(*points, strict=True)
            color = CLIENT_COLORS.get(pairing["client"])
            ax.plot(xs, ys, color=color, linewidth=1.2, label=_label(pairing))
    ax.set_xlabel("seconds since the pairing started")
    ax.set_ylabel("successful logical requests/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    return _save(fig, path)


def _states(pairings: Sequence[dict[str, Any]], path: Path) -> Path:
    fig, axes = plt.subplots(
        len(pairings), 1, figsize=(8, 1.5 * len(pairings) + 0.8), dpi=80, squeeze=False
    )
    for ax, pairing in zip(axes[:, 0], pairings, strict=True):
        states = pairing["timeseries"]["replica_states"]
        for index, segments in states.items():
            row = int(index)
            for state in _STATE_COLORS:
                bars = [(a, b - a) for a, b, s in segments if s == state]
                if bars:
                    ax.broken_barh(bars, (row - 0.4, 0.8), color=_STATE_COLORS[state])
        ax.set_yticks(range(len(states)))
        ax.set_yticklabels([_replica_name(pairing, int(i)) for i in states], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(_label(pairing), fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in _STATE_COLORS.values()]
    axes[0, 0].legend(handles, list(_STATE_COLORS), fontsize=7, loc="upper right", ncol=4)
    axes[-1, 0].set_xlabel("seconds since the pairing started")
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    shrink_png(path)
    return path


def plot_fleet(
    pairings: Sequence[dict[str, Any]], marks: Sequence[tuple[float, str]], out_dir: Path
) -> list[Path]:
    """Write the fleet's plots to ``out_dir``; ``marks``: (time, what) of each fault's start
    and of the recovery. Returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _per_replica(
            pairings,
            "attempts_per_s_by_replica",
            "attempts/s at the replica",
            marks,
            out_dir / "attempts_per_replica.png",
        ),
        _per_replica(
            pairings,
            "client_attempts_per_s_by_replica",
            "attempts/s sent",
            marks,
            out_dir / "client_attempts_per_replica.png",
        ),
        _successes(pairings, marks, out_dir / "successes_per_s.png"),
        _states(pairings, out_dir / "replica_states.png"),
    ]
