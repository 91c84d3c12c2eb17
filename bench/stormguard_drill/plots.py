"""PNG plots over time, one line per pairing, one file per series.

matplotlib's Agg backend: no display needed. Small figures at a low DPI with a
palette (Pillow, which matplotlib requires), because the full run's plots are committed
under docs/benchmarks/.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
from PIL import Image

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# (series key, y label, file name)
PLOTS = (
    ("attempts_per_s", "attempts/s at the server", "attempts_per_s.png"),
    ("successes_per_s", "successful logical requests/s", "successes_per_s.png"),
    ("queue_depth", "queue depth (requests)", "queue_depth.png"),
    ("kv_cache_usage", "KV-cache usage (0..1)", "kv_cache_usage.png"),
    ("restarts", "engine restarts (cumulative)", "restarts.png"),
)
# Only where a pairing has the series (stormguard's clients: their concurrency limit).
OPTIONAL_PLOTS = (("client_limit", "client concurrency limit", "client_limit.png"),)
_STYLE = {"off": "--", "on": "-"}
CLIENT_COLORS = {
    "openai": "tab:red",
    "openai+tenacity": "tab:orange",
    "stormguard": "tab:blue",
    "openai+sg-httpx": "tab:cyan",
    "litellm": "tab:green",
    "litellm-router": "tab:olive",
}


def shrink_png(path: Path) -> None:
    """A 64-colour palette: a third of the bytes, no visible loss for line plots."""
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


def plot_all(
    pairings: Sequence[dict[str, Any]],
    burst: tuple[float, float] | None,
    out_dir: Path,
    span_label: str = "burst of long prompts",
) -> list[Path]:
    """Write every plot to ``out_dir``; returns the paths. ``burst``: the window shaded
    grey (None: none), named ``span_label`` in the legend."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    optional = [
        plot for plot in OPTIONAL_PLOTS if any(p["timeseries"].get(plot[0]) for p in pairings)
    ]
    for key, label, filename in (*PLOTS, *optional):
        fig, ax = plt.subplots(figsize=(8, 3.6), dpi=80)
        if burst is not None:
            ax.axvspan(*burst, color="0.85", label=span_label)
        for p in pairings:
            points = p["timeseries"].get(key)
            if not points:
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(
                xs,
                ys,
                _STYLE.get(p["admission"], "-"),
                color=CLIENT_COLORS.get(p["client"]),
                linewidth=1.2,
                label=f"{p['client']}, admission {p['admission']}",
            )
        ax.set_xlabel("seconds since the pairing started")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
        fig.tight_layout()
        path = out_dir / filename
        fig.savefig(path)
        plt.close(fig)
        shrink_png(path)
        paths.append(path)
    return paths
