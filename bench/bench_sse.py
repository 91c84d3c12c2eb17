"""The SSE decoder's time against input size: linear, whatever the stream holds.

    .venv/bin/python bench/bench_sse.py [--sizes 1 16 64]

Four streams a hostile or broken server can send, each fed in 64 KiB chunks (as
httpx hands them over) and in one chunk (a decompressed gzip bomb): a flood of
blank lines, tiny events (``data:x`` and a blank line, 8 bytes each), tiny events
with a space (``data: x``, 9 bytes: pieces of one-line ``data: `` events take a
way of their own through the decoder), and one line that never ends (with the
event cap raised so it is not refused). For each size (MiB): seconds, and seconds
per MiB, which stays flat when the time is linear.
Not a timed test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from stormguard._io.sse import SSEDecoder

MIB = 1 << 20
CHUNK = 1 << 16

STREAMS: dict[str, Callable[[int], bytes]] = {
    "blank lines": lambda size: b"\n" * size,
    "tiny events": lambda size: b"data:x\n\n" * (size // 8),
    "tiny data: events": lambda size: b"data: x\n\n" * (size // 9),
    "one endless line": lambda size: b"x" * size,
}


def decode(stream: bytes, chunk: int) -> float:
    decoder = SSEDecoder(max_event_bytes=len(stream) + 1)
    began = time.perf_counter()
    for at in range(0, len(stream), chunk):
        decoder.feed(stream[at : at + chunk])
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64], help="MiB")
    args = parser.parse_args()
    print(f"{'stream':<17} {'fed as':<10} " + "  ".join(f"{s:>4} MiB (s/MiB)" for s in args.sizes))
    for name, make in STREAMS.items():
        for fed, chunk in (("64 KiB", CHUNK), ("one chunk", None)):
            cells = []
            for size in args.sizes:
                stream = make(size * MIB)
                seconds = decode(stream, chunk or len(stream))
                cells.append(f"{seconds:7.3f} ({seconds / size:.4f})")
            print(f"{name:<17} {fed:<10} " + "  ".join(cells))


if __name__ == "__main__":
    main()
