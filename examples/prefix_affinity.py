"""Prefix-cache affinity: each conversation's turns on one replica of three.

Starts three reference servers on free loopback ports, standing for three vLLM
replicas of one model. Each turn of a conversation repeats the conversation so far,
so the replica that served the last turn holds most of the next one's prompt in its
prefix cache; scattered over replicas, every turn pays its whole prefill again.

1. ``AffinityPolicy(derive_from_prompt=True)``: a key from each conversation's
   start (its system prompt and first user message) sends all its turns to the
   same replica, the key's home; different conversations spread over the three.
2. ``affinity=None``: the same conversations go by load alone, and scatter.
3. ``prompt_cache_key`` (honoured by default): each tenant's calls go to its home.
4. One replica stops: the conversations it was home to move to their next replica,
   and stay there; the others do not move.

    python examples/prefix_affinity.py
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
from stormguard import AffinityPolicy, Endpoint

MODEL = "stormguard-sim"
SYSTEM = {"role": "system", "content": "You answer questions about the quarterly report."}
PEOPLE = ("alice", "bob", "carol", "dave", "erin", "frank")
TURNS = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Replica:
    """A reference server on a free loopback port (no admin endpoint: none is needed)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        command = [
            sys.executable, "-m", "stormguard_server", "--port", str(self.port),
            "--model", MODEL, "--log-level", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(command)

    def wait_ready(self) -> None:
        started = time.monotonic()
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/ready", timeout=1).status_code == 200:
                    return
            if time.monotonic() - started > 30:
                raise SystemExit(f"{self.name} did not become ready in 30 s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@contextlib.contextmanager
def three_replicas() -> Iterator[list[Replica]]:
    replicas = [Replica(f"replica-{letter}") for letter in "abc"]
    try:
        for replica in replicas:
            replica.wait_ready()
        yield replicas
    finally:
        for replica in replicas:
            replica.stop()


def client_of(replicas: list[Replica], **options: object) -> stormguard.Client:
    return stormguard.Client(
        base_url=[Endpoint(r.base_url, name=r.name) for r in replicas],
        model=MODEL,
        timeout=10,
        **options,  # type: ignore[arg-type]
    )


def conversation(client: stormguard.Client, person: str, turns: int = TURNS) -> list[str]:
    """``turns`` turns of one conversation, each sending the whole conversation so far;
    the replica that served each."""
    messages = [SYSTEM, {"role": "user", "content": f"I am {person}. What changed this quarter?"}]
    served = []
    for turn in range(turns):
        resp = client.chat.completions.create(messages=messages, max_tokens=8)
        served.append(resp.attempt_history[-1].endpoint or "?")
        messages += [
            {"role": "assistant", "content": resp.choices[0].message.content or ""},
            {"role": "user", "content": f"And in section {turn + 2}?"},
        ]
    return served


def main() -> None:
    with three_replicas() as replicas:
        with client_of(replicas, affinity=AffinityPolicy(derive_from_prompt=True)) as client:
            homes = {}
            for person in PEOPLE:
                served = conversation(client, person)
                homes[person] = served[-1]
                print(f"1. {person}: {' '.join(served)}")
            stats = client.stats()
            print(f"1. affinity hits {stats.affinity_hits}, overflows {stats.affinity_overflows}")

        with client_of(replicas, affinity=None) as client:
            for person in PEOPLE:
                print(f"2. {person}: {' '.join(conversation(client, person))}")

        with client_of(replicas) as client:  # AffinityPolicy() by default
            for tenant in ("acme", "globex", "initech"):
                served = [
                    client.chat.completions.create(
                        messages=[{"role": "user", "content": "Status?"}],
                        max_tokens=4,
                        extra_body={"prompt_cache_key": tenant},
                    )
                    .attempt_history[-1]
                    .endpoint
                    or "?"
                    for _ in range(TURNS)
                ]
                print(f"3. tenant {tenant}: {' '.join(served)}")

        with client_of(replicas, affinity=AffinityPolicy(derive_from_prompt=True)) as client:
            gone = max(set(homes.values()), key=list(homes.values()).count)
            next(r for r in replicas if r.name == gone).stop()
            print(f"4. {gone} stopped")
            for person in PEOPLE:
                served = conversation(client, person, turns=2)
                moved = "moved" if served[-1] != homes[person] else "stayed"
                print(f"4. {person}: was {homes[person]}, now {' '.join(served)} ({moved})")


if __name__ == "__main__":
    main()
