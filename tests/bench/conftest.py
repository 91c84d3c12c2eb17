"""The benchmarks' own logic (their workloads, their arithmetic), tested without a
server. The scripts live in bench/, which is not a package: it goes on the path here."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
