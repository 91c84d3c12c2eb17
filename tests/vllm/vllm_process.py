"""Start real vLLM (CPU build) on a free loopback port with a tiny local model.

Used by the vLLM tests and the drill's ``--engine vllm``; every process is
stopped (SIGINT, then SIGKILL) when its ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.e2e.server_process import free_port

# Small and quick: eager mode starts in ~20 s instead of ~50 s (no torch.compile), and
# a 4.5 MB KV cache (4,384 tokens of the tiny model) shows queueing and preemption.
# The context is the tiny model's whole 4,096 positions so that a test can hold a
# request in the engine for seconds (thousands of tokens), longer than this machine
# can starve the test process of CPU (measured: up to 2.6 s while vLLM generates).
TINY_ARGS = (
    "--max-model-len",
    "4096",
    "--kv-cache-memory-bytes",
    "4500000",
    "--enforce-eager",
)
# A bound, not a wait: about 20 s on a quiet machine, but vLLM runs niced (below), so
# beside other busy processes on 2 cores its start took 130-270 s.
STARTUP_TIMEOUT_S = 600.0
# Seconds a test waits for a vLLM metric to reach its value (a bound, not a sleep).
METRIC_WAIT_S = 60.0
# vLLM's processes run at a lower priority than the tests (see _yield_cpu_to_the_tests).
SERVER_NICE = 10


@dataclass
class VllmServer:
    port: int
    model: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a vLLM metric over the label sets that have ``labels``, e.g.
        ``metric("vllm:request_success_total", finished_reason="abort")``."""
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        total = 0.0
        for line in httpx.get(f"{self.root}/metrics", timeout=10).text.splitlines():
            if not (line.startswith(name + "{") or line.startswith(name + " ")):
                continue
            if all(label in line for label in wanted):
                total += float(line.rpartition(" ")[2])
        return total


@contextlib.contextmanager
def run_vllm(
    model: str, *args: str, admission: bool = True, extra: Sequence[str] = TINY_ARGS
) -> Iterator[VllmServer]:
    """``stormguard-server --engine vllm`` (admission=True) or plain vLLM (False)."""
    port = free_port()
    if admission:
        command = [sys.executable, "-m", "stormguard_server", "--engine", "vllm"]
        command += ["--model", model, "--port", str(port), *args, *extra]
    else:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        command += ["--model", model, "--host", "127.0.0.1", "--port", str(port), *args, *extra]
    command = ["nice", "-n", str(SERVER_NICE), *command]
    with tempfile.TemporaryDirectory(prefix="vllm-ipc-", ignore_cleanup_errors=True) as ipc:
        # vLLM's API server and engine core talk over ZMQ sockets it names in this
        # directory (the temp directory by default) and leaves there when killed.
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "PYTHONUNBUFFERED": "1",
            "VLLM_RPC_BASE_PATH": ipc,
        }
        with _started(command, env, model, port) as server:
            yield server


@contextlib.contextmanager
def _started(
    command: list[str], env: dict[str, str], model: str, port: int
) -> Iterator[VllmServer]:
    with tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False) as f:
        log_path = Path(f.name)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    _yield_cpu_to_the_tests(process.pid)
    server = VllmServer(port=port, model=model, process=process, log_path=log_path)
    try:
        _wait_healthy(server)
        yield server
    finally:
        _stop(server)
        with contextlib.suppress(OSError):
            log_path.unlink()


def _yield_cpu_to_the_tests(pid: int) -> None:
    """Let the test process run whenever it is ready, however busy vLLM is.

    vLLM runs in a session of its own, so Linux schedules it as an autogroup of
    its own against the tests' autogroup, and the nice value of its processes
    (set at start) does not count across groups; the group's own nice value does.
    Measured on 2 cores, without it: 9 of 12 streams reached the test only once
    their whole generation was over (the test process waited for CPU for up to
    2.6 s at a time); with it: 0 of 12, at the same generation speed. A caller on
    its own machine has its own CPU; the tests stand for that caller.
    """
    with contextlib.suppress(OSError):  # a kernel without autogroups: `nice` alone
        Path(f"/proc/{pid}/autogroup").write_text(f"{SERVER_NICE}\n")


def _wait_healthy(server: VllmServer) -> None:
    start = time.monotonic()
    while time.monotonic() - start < STARTUP_TIMEOUT_S:
        if server.process.poll() is not None:
            raise RuntimeError(f"vLLM exited early:\n{server.log()[-6000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.root}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"vLLM not healthy after {STARTUP_TIMEOUT_S} s:\n{server.log()[-6000:]}")


def _stop(server: VllmServer) -> None:
    """vLLM runs an engine-core process beside the API server: stop the whole group."""
    if server.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGINT)
        try:
            server.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=10)
