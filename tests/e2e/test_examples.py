"""Every example runs, against a real reference server it starts itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_openai_transport_example() -> None:
    out = run("openai_transport.py")
    assert "answer: " in out and "stream: " in out
    assert "refused: 400 too_long" in out
    assert "stormguard: 3 calls, 3 attempts, amplification 1.00" in out
