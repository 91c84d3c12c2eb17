"""`make demo` runs examples/demo.py: it must run to the end and show what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def test_demo_runs_and_shows_completion_headers_and_a_shed_request() -> None:
    done = subprocess.run(
        [sys.executable, str(DEMO)], capture_output=True, text=True, timeout=90, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "content: '" in out and "usage: prompt_tokens=" in out
    assert "x-token-capacity=1843" in out
    assert "refused: HTTP 503 ServiceUnavailableError" in out
    assert "x-load-shed: queue_full" in out
    assert "Retry-After: " in out and "x-should-retry: True" in out
    assert 'stormguard_shed_total{priority="sheddable",reason="queue_full"} 1.0' in out
    assert "server stopped" in out
