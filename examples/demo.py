"""The main job in one run: the reference server and a stormguard client against it.

    make demo            # or: .venv/bin/python examples/demo.py

It starts ``stormguard-server`` on a free loopback port, waits for /ready, and
shows what a user sees: a completion with its usage, the load headers the
server puts on every response, a streamed completion, and then, with the
server's budget held busy and its (deliberately tiny) queue full, a request
that is shed with its reason and an honest Retry-After. Then it stops the
server and prints what the server counted.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx

import stormguard

MODEL = "stormguard-sim"
# A small engine so the demo can fill it in a moment: 2048-token KV cache
# (admission budget 2048 x 0.9 = 1843 tokens), a queue of 2 requests.
SERVER_ARGS = [
    "--num-kv-blocks", "128",
    "--max-model-len", "2048",
    "--max-queue-requests", "2",
    "--log-level", "warning",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def reference_server() -> Iterator[str]:
    """Run stormguard-server in a subprocess; yield its root URL once /ready says yes."""
    port = free_port()
    command = [sys.executable, "-m", "stormguard_server", "--port", str(port), *SERVER_ARGS]
    print(f"$ stormguard-server --port {port} {' '.join(SERVER_ARGS)}")
    process = subprocess.Popen(command)
    root = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:
            if process.poll() is not None:
                raise SystemExit(f"the server exited with {process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{root}/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() - started > 30:
                raise SystemExit("the server did not become ready in 30 s")
            time.sleep(0.1)
        print(f"server ready at {root} after {time.monotonic() - started:.1f} s\n")
        yield root
    finally:
        process.terminate()
        process.wait(timeout=10)


def show_load(load: stormguard.ServerLoad) -> None:
    print(
        f"  load headers: x-queue-depth={load.queue_depth} x-queue-tokens={load.queue_tokens} "
        f"x-inflight-tokens={load.inflight_tokens} x-token-capacity={load.token_capacity} "
        f"x-kv-cache-usage={load.kv_cache_usage}"
    )


def hold(root: str, body: dict[str, object], priority: str, stop: threading.Event) -> None:
    """A caller that keeps a request running (streaming) until told to leave."""
    headers = {"x-priority": priority}
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"{root}/v1/completions", json=body, headers=headers) as response,
    ):
        for _ in response.iter_lines():
            if stop.is_set():
                return  # closing the stream makes the server abort the request


def main() -> None:
    with reference_server() as root:
        client = stormguard.Client(base_url=f"{root}/v1", api_key="demo", model=MODEL, timeout=30)

        print("1. A chat completion")
        resp = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Why do retry storms happen?"}],
            max_tokens=16,
        )
        print(f"  content: {resp.choices[0].message.content!r}")
        assert resp.usage is not None
        print(
            f"  usage: prompt_tokens={resp.usage.prompt_tokens} "
            f"completion_tokens={resp.usage.completion_tokens}"
        )
        show_load(resp.server_load)

        print("\n2. A streamed completion")
        print("  text:", end="", flush=True)
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Stream, please."}],
            max_tokens=12,
            stream=True,
        ):
            if chunk.choices:
                print(chunk.choices[0].delta.content or "", end="", flush=True)
        print()

        # One critical caller takes 1 + 1830 of the 1843-token budget; two more queue.
        print("\n3. Overload: the budget is held busy and the queue fills up")
        stop = threading.Event()
        holder_body = {"prompt": "hold", "max_tokens": 1830, "ignore_eos": True, "stream": True}
        queued_body = {"prompt": "wait", "max_tokens": 40, "ignore_eos": True, "stream": True}
        callers = [threading.Thread(target=hold, args=(root, holder_body, "critical", stop))]
        callers += [
            threading.Thread(target=hold, args=(root, queued_body, "standard", stop))
            for _ in range(2)
        ]
        for caller in callers:
            caller.start()
            time.sleep(0.2)
        snapshot = stormguard.ServerLoad.from_headers(httpx.get(f"{root}/health").headers)
        show_load(snapshot)

        print("\n4. A sheddable request arrives (no retries, to show the refusal itself)")
        impatient = stormguard.Client(
            base_url=f"{root}/v1",
            api_key="demo",
            model=MODEL,
            timeout=10,
            priority="sheddable",
            retry_policy=stormguard.RetryPolicy(max_attempts=1),
            concurrency=None,  # no local queue either: a shed would otherwise wait in it
        )
        try:
            impatient.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "me too?"}], max_tokens=8
            )
            print("  (unexpectedly served)")
        except stormguard.APIStatusError as exc:
            load = exc.server_load
            print(f"  refused: HTTP {exc.status_code} {type(exc).__name__}")
            print(f"  x-load-shed: {load.load_shed}")
            print(f"  Retry-After: {load.retry_after:.3f} s (when running work frees room)")
            print(f"  x-should-retry: {load.should_retry}")
            show_load(load)
        finally:
            impatient.close()
            stop.set()
            for caller in callers:
                caller.join(timeout=30)

        print("\n5. What the server counted (/metrics)")
        wanted = ("stormguard_admitted_total", "stormguard_shed_total", "stormguard_engine_oom")
        for line in httpx.get(f"{root}/metrics").text.splitlines():
            if line.startswith(wanted):
                print(f"  {line}")
        client.close()
    print("\nserver stopped. Run `stormguard-server --help` for every flag; see docs/server.md.")


if __name__ == "__main__":
    main()
