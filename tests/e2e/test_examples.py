"""Every example runs, against a real reference server it starts itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_openai_transport_example() -> None:
    out = run("openai_transport.py")
    assert "answer: " in out and "stream: " in out
    assert "refused: 400 too_long" in out
    assert "stormguard: 3 calls, 3 attempts, amplification 1.00" in out


def test_tracing_example_exports_client_and_server_spans() -> None:
    from tests.e2e.otlp_receiver import OTLPReceiver

    with OTLPReceiver() as receiver:
        out = run("tracing.py", "--otlp-endpoint", receiver.endpoint, "--calls", "4")
        spans = receiver.spans()
    assert out.count(": trace ") == 4 and "traces exported to" in out
    services = {s.service for s in spans}
    assert services == {"tracing-example", "stormguard-server"}
    roots = [s for s in spans if s.parent_id is None]
    assert sorted(s.name for s in roots) == [f"example request {i}" for i in range(1, 5)]
    assert {s.name for s in spans} >= {"chat stormguard-sim", "admission", "engine prefill"}


def test_discovery_example_keeps_each_class_in_its_pool_and_spills_batch_work() -> None:
    out = run("discovery.py")
    first, second = out.split("2. ")
    lines = [line.strip() for line in first.splitlines() if line.strip().startswith(("s", "b"))]
    assert all(".3:" in line for line in lines if line.startswith("sheddable"))
    assert all(".3:" not in line for line in lines if line.startswith("standard"))
    spilled = [line for line in second.splitlines() if line.strip().startswith("sheddable")]
    assert spilled and all(line.rstrip().endswith("(ok)") for line in spilled)
    assert all(".3:" not in line.split("->")[-1] for line in spilled)
    assert "10 calls" in out


@pytest.mark.slow
def test_quota_batch_example_paces_processes_on_one_key_without_429s() -> None:
    # 3 processes x 4 threads, 60 calls of ~215 tokens on 12,000 TPM: past the first
    # minute's bucket, ~6 s at the key's rate. Unpaced, 12 calls in flight spend the
    # bucket in ~3 s and then meet a 429 per call.
    out = run(
        "quota_batch.py",
        *("--processes", "3", "--threads", "4", "--calls", "60"),
        *("--tpm", "12000", "--max-tokens", "200"),
    )
    assert "calls: 60 of 60 succeeded; failed: 0" in out, out
    refused = re.search(r"quota 429s: (\d+)", out)
    sent = re.search(r"requests: (\d+) sent", out)
    assert refused is not None and sent is not None, out
    assert int(refused[1]) <= 2 and int(sent[1]) <= 62, out
    assert out.count("share of the key 0.") == 3, out
