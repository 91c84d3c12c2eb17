"""Slow and hostile clients against the reference server: what they hold, for how
long, and what they cost the normal requests beside them.

    .venv/bin/python bench/bench_slowloris.py [--slow 200] [--duration 15] [--rounds 2]
        [--threads 4] [--idle 1100] [--bodies 400] [--heads 200] [--server-path DIR]
        [--json FILE]

Four cases, each on a fresh ``python -m stormguard_server`` with its default
flags (sim engine, 127.0.0.1, a free port):

- ``slowloris``: normal chat calls (``max_tokens`` 8) from ``--threads`` threads
  on keep-alive connections for ``--duration`` seconds, alone, then beside
  ``--slow`` connections that send their headers a byte a second and never end
  them (an attacker in its own process, which opens a new connection for each
  one the server closes, for at least 13 s); ``--rounds`` times, then alone once
  more (alternating, so that a change in the machine's other load falls on
  both). Reported: p50/p99 of the normal calls alone and beside the slowloris,
  each pooled over its phases, and how long the slow connections stayed open.
  Target: p99 beside the slowloris within 1.2x of p99 alone; every slow
  connection closed within the header timeout (10 s by default).
- ``idle-flood``: the server's file-descriptor limit set to 1024 (``ulimit -n
  1024``, soft and hard); 20 normal calls at once, each on a new connection
  with a 5 s timeout, then ``--idle`` connections opened as fast as possible
  that never send a byte, the same 20 calls right after them and again 1 s
  later: how many succeed, and their p99; the server's RSS per idle
  connection.
- ``bodies``: ``--bodies`` connections that each declare a 1,000,000-byte body
  and send 999,000 bytes of it: the server's RSS before, at its peak while they
  are held, and after the body timeout (30 s by default) has answered them 408
  (or, for a server without one, once the clients have given up and closed).

- ``heads``: hostile request heads. ``--heads`` connections that each send a
  58 KiB head of 2,000 headers declaring a 10,000-byte body, and 100 bytes of
  it: the answers, and the server's RSS before, while they are held, and 2 s
  after the clients have closed; the same with the largest head the server
  takes (16 KiB, 100 header lines): what each such connection holds. Then
  1,000 heads of 3,000 headers (94.5 KiB) one after another: the server's CPU
  time per head (``/proc/PID/stat``), and per normal head for comparison.

``--server-path DIR`` runs the server from another source tree (its ``server/``
directory is put first on the server's PYTHONPATH), for a before/after against
an older commit: ``git archive COMMIT server | tar -x -C DIR``. Not a timed
test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.e2e.hostile_client

from tests.e2e.hostile_client import (
    PARTIAL_HEADERS,
    Held,
    hold,
    many_headers_head,
    open_held,
    partial_body_request,
)

from stormguard_drill.servers import free_port

CHAT = {
    "model": "stormguard-sim",
    "messages": [{"role": "user", "content": "Say hello to the benchmark"}],
    "max_tokens": 8,
}
TARGET_P99_RATIO = 1.2


# The server under test


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def memory_mb(self) -> tuple[float, float]:
        """Resident memory now and its peak so far (VmRSS, VmHWM), in MB."""
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in {"VmRSS", "VmHWM"}:
                fields[name] = int(value.split()[0]) * 1024 / 1e6
        return fields["VmRSS"], fields["VmHWM"]


@contextlib.contextmanager
def running_server(
    *args: str, server_path: Path | None = None, fd_limit: int | None = None
) -> Iterator[Server]:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if server_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(server_path / "server"), env.get("PYTHONPATH")])
        )

    def limit_fds() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    with tempfile.NamedTemporaryFile(prefix="bench-slowloris-", suffix=".log", delete=False) as f:
        log_path = Path(f.name)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "stormguard_server", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=limit_fds,  # no other thread runs in this process meanwhile
        )
    server = Server(port, process, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited:\n{log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(server.url("/ready"), timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"server not ready:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield server
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_path.unlink()


# Normal traffic


@dataclass
class Latencies:
    ok: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Latencies) -> None:
        self.ok += other.ok
        for name, count in other.errors.items():
            self.errors[name] = self.errors.get(name, 0) + count

    def summary(self) -> dict[str, Any]:
        ok = sorted(self.ok)
        return {
            "calls": len(ok) + sum(self.errors.values()),
            "ok": len(ok),
            "errors": dict(self.errors),
            "p50_ms": round(1e3 * statistics.median(ok), 1) if ok else None,
            "p99_ms": round(1e3 * _p99(ok), 1) if ok else None,
        }


def _p99(sorted_values: list[float]) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(0.99 * len(sorted_values)))]


def timed_call(
    client: httpx.Client, server: Server, result: Latencies, lock: threading.Lock
) -> None:
    """One chat call: its time when it succeeds, else what it ended with."""
    start = time.perf_counter()
    try:
        response = client.post(server.url("/v1/chat/completions"), json=CHAT)
        outcome = None if response.status_code == 200 else str(response.status_code)
    except httpx.HTTPError as exc:
        outcome = type(exc).__name__
    elapsed = time.perf_counter() - start
    with lock:
        if outcome is None:
            result.ok.append(elapsed)
        else:
            result.errors[outcome] = result.errors.get(outcome, 0) + 1


def normal_traffic(server: Server, threads: int, duration: float) -> Latencies:
    """Chat calls from ``threads`` threads on keep-alive connections for ``duration`` s."""
    result = Latencies()
    lock = threading.Lock()
    stop_at = time.monotonic() + duration

    def caller() -> None:
        with httpx.Client(timeout=30) as client:
            while time.monotonic() < stop_at:
                timed_call(client, server, result, lock)

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return result


def calls_at_once(client: httpx.Client, server: Server, n: int) -> Latencies:
    """``n`` chat calls at once from ``client`` (one without keep-alive: each call
    opens a new connection)."""
    result = Latencies()
    lock = threading.Lock()
    go = threading.Event()

    def call() -> None:
        go.wait()
        timed_call(client, server, result, lock)

    workers = [threading.Thread(target=call) for _ in range(n)]
    for worker in workers:
        worker.start()
    go.set()
    for worker in workers:
        worker.join()
    return result


# The slowloris, in a process of its own (its CPU is not the normal clients')


def slowloris(port: int, n: int, interval: float, ready: Any, stop: Any, out: Connection) -> None:
    """Keep ``n`` connections sending headers a byte every ``interval`` s; a new one
    for each the server closes. Sends back how long each closed one stayed open, and
    the ages of those still open at the stop."""
    lifetimes: list[float] = []
    conns: list[Held] = [open_held(port, PARTIAL_HEADERS) for _ in range(n)]
    ready.set()
    next_byte = time.monotonic() + interval
    with selectors.DefaultSelector() as selector:
        for held in conns:
            selector.register(held.sock, selectors.EVENT_READ, held)
        while not stop.is_set():
            closed: list[Held] = []
            for key, _ in selector.select(max(0.0, min(0.1, next_byte - time.monotonic()))):
                held = key.data
                hold([held], timeout=0)
                if held.closed is not None:
                    closed.append(held)
            if time.monotonic() >= next_byte:
                next_byte += interval
                for held in conns:
                    if held.closed is None and held not in closed:
                        try:
                            held.sock.send(b"x")
                        except OSError:
                            held.closed = time.monotonic()
                            closed.append(held)
            for held in closed:
                selector.unregister(held.sock)
                conns.remove(held)
                assert held.closed_after is not None
                lifetimes.append(held.closed_after)
                held.close()
                with contextlib.suppress(OSError):
                    fresh = open_held(port, PARTIAL_HEADERS)
                    conns.append(fresh)
                    selector.register(fresh.sock, selectors.EVENT_READ, fresh)
    now = time.monotonic()
    out.send({"lifetimes": lifetimes, "open_ages": [now - held.opened for held in conns]})
    for held in conns:
        held.close()


def case_slowloris(args: argparse.Namespace) -> dict[str, Any]:
    alone, beside = Latencies(), Latencies()
    lifetimes: list[float] = []
    open_ages: list[float] = []
    with running_server(server_path=args.server_path) as server:
        normal_traffic(server, args.threads, 2)  # warm-up
        for _ in range(args.rounds):
            alone.merge(normal_traffic(server, args.threads, args.duration))
            slow, during = _beside_slowloris(server, args)
            beside.merge(during)
            lifetimes += slow["lifetimes"]
            open_ages += slow["open_ages"]
        alone.merge(normal_traffic(server, args.threads, args.duration))
    lifetimes.sort()
    result: dict[str, Any] = {"alone": alone.summary(), "beside_slowloris": beside.summary()}
    result["p99_ratio"] = round(result["beside_slowloris"]["p99_ms"] / result["alone"]["p99_ms"], 2)
    result["slow_connections"] = {
        "closed": len(lifetimes),
        "open_p50_s": round(statistics.median(lifetimes), 2) if lifetimes else None,
        "open_max_s": round(lifetimes[-1], 2) if lifetimes else None,
        "still_open_at_stops": len(open_ages),
        "oldest_at_a_stop_s": round(max(open_ages), 2) if open_ages else None,
    }
    return result


def _beside_slowloris(server: Server, args: argparse.Namespace) -> tuple[dict[str, Any], Latencies]:
    """Normal traffic beside a slowloris that lasts long enough for its first
    connections to reach the header timeout (10 s); what the slowloris saw."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    receiver, sender = context.Pipe(duplex=False)
    attacker = context.Process(
        target=slowloris, args=(server.port, args.slow, 1.0, ready, stop, sender)
    )
    attacker.start()
    if not ready.wait(60):
        raise RuntimeError("the slowloris could not open its connections")
    started = time.monotonic()
    during = normal_traffic(server, args.threads, args.duration)
    time.sleep(max(0.0, 13.0 - (time.monotonic() - started)))
    stop.set()
    slow: dict[str, Any] = receiver.recv()
    attacker.join()
    return slow, during


def case_idle_flood(args: argparse.Namespace) -> dict[str, Any]:
    no_keep_alive = httpx.Limits(max_keepalive_connections=0)
    with (
        running_server(server_path=args.server_path, fd_limit=1024) as server,
        httpx.Client(limits=no_keep_alive, timeout=5) as client,
    ):
        alone = calls_at_once(client, server, 20)
        rss_before, _ = server.memory_mb()
        conns = []
        for _ in range(args.idle):
            with contextlib.suppress(OSError):
                conns.append(open_held(server.port, timeout=5))
        at_once = calls_at_once(client, server, 20)  # right after the flood
        hold(conns, timeout=1.0)
        rss_idle, _ = server.memory_mb()
        still_open = sum(held.closed is None for held in conns)
        later = calls_at_once(client, server, 20)
        for held in conns:
            held.close()
        log = server.log_path.read_text()
    return {
        "idle_opened": len(conns),
        "idle_still_open": still_open,
        "accept_out_of_fds_warnings": log.count('"accept_out_of_fds"'),
        "asyncio_accept_errors": log.count("out of system resource"),
        "rss_before_mb": round(rss_before, 1),
        "rss_with_idle_mb": round(rss_idle, 1),
        "kb_per_idle_connection": round(1e3 * (rss_idle - rss_before) / max(1, still_open), 1),
        "normal_calls_alone": alone.summary(),
        "normal_calls_right_after_the_flood": at_once.summary(),
        "normal_calls_1_s_later": later.summary(),
    }


def case_bodies(args: argparse.Namespace) -> dict[str, Any]:
    with running_server(server_path=args.server_path) as server:
        httpx.post(server.url("/v1/chat/completions"), json=CHAT, timeout=30)
        rss_before, _ = server.memory_mb()
        conns: list[Held] = []
        refused_while_sending = 0
        start = time.monotonic()
        for _ in range(args.bodies):
            try:
                held = open_held(server.port, timeout=10)
                held.sock.setblocking(True)
                held.sock.settimeout(10)
                held.sock.sendall(partial_body_request(1_000_000, 999_000))
                held.sock.setblocking(False)
                conns.append(held)
            except OSError:  # refused and closed while sending
                refused_while_sending += 1
        hold(conns, timeout=1.0)
        rss_held, peak = server.memory_mb()
        # Wait for the body timeout (30 s by default) to answer them; a server
        # without one keeps them until the clients give up (40 s).
        hold(conns, timeout=max(0.0, 40.0 - (time.monotonic() - start)))
        answered_408 = sum(held.status() == 408 for held in conns)
        still_open = sum(held.closed is None for held in conns)
        for held in conns:
            held.close()
        time.sleep(2.0)  # the server notices the closes and frees the requests
        rss_after, peak = server.memory_mb()
    statuses: dict[str, int] = {}
    for held in conns:
        key = str(held.status())
        statuses[key] = statuses.get(key, 0) + 1
    return {
        "bodies": args.bodies,
        "refused_while_sending": refused_while_sending,
        "statuses": statuses,
        "answered_408": answered_408,
        "still_open_at_40_s": still_open,
        "rss_before_mb": round(rss_before, 1),
        "rss_held_mb": round(rss_held, 1),
        "rss_peak_mb": round(peak, 1),
        "rss_after_mb": round(rss_after, 1),
    }


def _cpu_s(server: Server) -> float:
    """CPU seconds the server process has used (user + system)."""
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hold_heads(server: Server, head: bytes, n: int) -> dict[str, Any]:
    """``n`` connections each sending ``head`` and 100 bytes of its body: the answers,
    and RSS before, while held, and after the clients close."""
    rss_before, _ = server.memory_mb()
    conns: list[Held] = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            conns.append(open_held(server.port, head + b" " * 100, timeout=10))
    hold(conns, timeout=2.0)
    rss_held, _ = server.memory_mb()
    statuses: dict[str, int] = {}
    for held in conns:
        key = str(held.status())
        statuses[key] = statuses.get(key, 0) + 1
    still_open = sum(held.closed is None for held in conns)
    for held in conns:
        held.close()
    time.sleep(2.0)  # the server notices the closes and frees the requests
    rss_after, peak = server.memory_mb()
    return {
        "connections": len(conns),
        "head_bytes": len(head),
        "statuses": statuses,
        "still_open_after_2_s": still_open,
        "rss_before_mb": round(rss_before, 1),
        "rss_held_mb": round(rss_held, 1),
        "rss_peak_mb": round(peak, 1),
        "rss_after_close_mb": round(rss_after, 1),
        "kb_per_connection": round(1e3 * (rss_held - rss_before) / max(1, len(conns)), 1),
    }


def _cpu_per_head(server: Server, head: bytes, n: int) -> dict[str, Any]:
    """Server CPU per head, ``n`` heads one after another on fresh connections (each
    says Connection: close, so the server ends every one)."""
    cpu_before = _cpu_s(server)
    started = time.monotonic()
    statuses: dict[str, int] = {}
    for _ in range(n):
        held = open_held(server.port, head, timeout=10)
        hold([held], timeout=10)
        key = str(held.status())
        statuses[key] = statuses.get(key, 0) + 1
        held.close()
    cpu = _cpu_s(server) - cpu_before
    return {
        "heads": n,
        "head_bytes": len(head),
        "statuses": statuses,
        "server_cpu_ms_per_head": round(1e3 * cpu / n, 3),
        "wall_s": round(time.monotonic() - started, 1),
    }


def case_heads(args: argparse.Namespace) -> dict[str, Any]:
    big = many_headers_head(2_000, 20, declared_body=10_000)  # 58 KiB
    # The largest head the server takes: 100 header lines, 16,384 bytes.
    largest = many_headers_head(96, 0, declared_body=10_000)
    largest = many_headers_head(96, (16_384 - len(largest)) // 96, declared_body=10_000)
    many = many_headers_head(3_000, 20, path=b"/v1/models")  # 94.5 KiB
    normal = many_headers_head(5, 20, path=b"/v1/models")
    with running_server(server_path=args.server_path) as server:
        httpx.post(server.url("/v1/chat/completions"), json=CHAT, timeout=30)
        return {
            "big_heads_held": _hold_heads(server, big, args.heads),
            # Twice: the second wave shows whether the first one's memory is reused.
            "largest_heads_taken_held": _hold_heads(server, largest, args.heads),
            "largest_heads_again": _hold_heads(server, largest, args.heads),
            "cpu_3000_headers": _cpu_per_head(server, many, 1_000),
            "cpu_normal_head": _cpu_per_head(server, normal, 1_000),
        }


CASES = {
    "slowloris": case_slowloris,
    "idle-flood": case_idle_flood,
    "bodies": case_bodies,
    "heads": case_heads,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--slow", type=int, default=200, help="slowloris connections")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="alone/beside rounds")
    parser.add_argument("--threads", type=int, default=4, help="normal callers")
    parser.add_argument("--idle", type=int, default=1100, help="idle connections")
    parser.add_argument("--bodies", type=int, default=400, help="partial 1 MB bodies")
    parser.add_argument("--heads", type=int, default=200, help="connections with big heads")
    parser.add_argument("--server-path", type=Path, default=None, help="another source tree")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(args.idle, args.bodies, args.slow, args.heads) + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    results: dict[str, Any] = {"load_average_start": os.getloadavg()}
    for name in args.cases:
        print(f"== {name}", flush=True)
        results[name] = CASES[name](args)
        print(json.dumps(results[name], indent=2), flush=True)
    results["load_average_end"] = os.getloadavg()
    if "slowloris" in results:
        ratio = results["slowloris"]["p99_ratio"]
        verdict = "met" if ratio <= TARGET_P99_RATIO else "MISSED"
        print(
            f"p99 beside the slowloris / alone: {ratio} (target <= {TARGET_P99_RATIO}: {verdict})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
