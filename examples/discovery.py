"""DNS discovery and pools by class, on one machine.

    .venv/bin/python examples/discovery.py

Three reference servers stand in for three pods: two interactive replicas on
127.0.0.1 and 127.0.0.2 and a batch replica on 127.0.0.3, all on one port, as
pods behind two headless services would be. A stub resolver plays the cluster's
DNS (``interactive.local`` and ``batch.local`` each resolve to their pods), so
the client is written as it would be in Kubernetes, only ``resolver=`` differs:

    Endpoint("dns+http://interactive.ns.svc:8000/v1", classes={"critical", "standard"})
    Endpoint("dns+http://batch.ns.svc:8000/v1", classes={"sheddable"})

Interactive calls spread over the interactive replicas; batch calls
(``x-priority: sheddable``) go to the batch replica only. Then the batch replica
stops: with ``SpillOver`` a batch call moves to an interactive replica whose last
load report (under 5 s old) shows headroom, and never to one that does not.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

import stormguard
from stormguard import DiscoveryConfig, Endpoint, SpillOver

MODEL = "stormguard-sim"
PODS = {"interactive.local": ["127.0.0.1", "127.0.0.2"], "batch.local": ["127.0.0.3"]}
MESSAGES = [{"role": "user", "content": "Summarise the incident."}]


def port_free_everywhere() -> int:
    """One port free on every pod address (Linux routes all of 127/8 to loopback)."""
    for _ in range(20):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            try:
                for address in ("127.0.0.2", "127.0.0.3"):
                    stack.enter_context(socket.socket()).bind((address, port))
            except OSError:
                continue
            return port
    raise SystemExit("no port free on 127.0.0.1-3")


@contextlib.contextmanager
def pod(address: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    command = [sys.executable, "-m", "stormguard_server", "--host", address, "--port", str(port)]
    process = subprocess.Popen([*command, "--log-level", "warning"])
    try:
        started = time.monotonic()
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the server on {address} exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{address}:{port}/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() - started > 30:
                raise SystemExit(f"the server on {address} did not become ready in 30 s")
            time.sleep(0.1)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)


def cluster_dns(host: str, port: int) -> list[str]:
    """The stub resolver: what a headless service's A records would say."""
    return PODS[host]


def call(client: stormguard.Client, priority: str) -> str:
    resp = client.chat.completions.create(
        messages=MESSAGES, max_tokens=8, extra_headers={"x-priority": priority}
    )
    return " -> ".join(f"{a.endpoint} ({a.outcome})" for a in resp.attempt_history)


def main() -> None:
    port = port_free_everywhere()
    with contextlib.ExitStack() as stack:
        processes = {
            address: stack.enter_context(pod(address, port))
            for address in ("127.0.0.1", "127.0.0.2", "127.0.0.3")
        }
        client = stack.enter_context(
            stormguard.Client(
                base_url=[
                    Endpoint(
                        f"dns+http://interactive.local:{port}/v1", classes={"critical", "standard"}
                    ),
                    Endpoint(f"dns+http://batch.local:{port}/v1", classes={"sheddable"}),
                ],
                model=MODEL,
                timeout=15,
                discovery=DiscoveryConfig(resolver=cluster_dns),
                spill_over=SpillOver(),  # batch work may use idle interactive replicas
            )
        )
        print("1. Interactive and batch calls, each to its own pool")
        for priority in ("standard", "sheddable") * 3:
            print(f"  {priority:9}: {call(client, priority)}")
        for state in client.stats().discovery:
            print(f"  {state.name} resolved to {', '.join(state.endpoints)}")

        print("\n2. The batch replica stops; batch calls spill onto interactive headroom")
        processes["127.0.0.3"].terminate()
        processes["127.0.0.3"].wait(timeout=10)
        for priority in ("standard", "sheddable") * 2:
            print(f"  {priority:9}: {call(client, priority)}")
        stats = client.stats()
        print(f"\n{stats.logical_calls} calls, {stats.attempts} attempts")


if __name__ == "__main__":
    main()
