"""Freed request buffers go back to the operating system.

glibc serves an allocation above its mmap threshold with ``mmap`` and unmaps it
on free, but it raises that threshold (up to 32 MiB) each time such a block is
freed: after one wave of large request bodies, the next ones come from the heap,
whose freed pages stay resident. Measured on the reference server with no
request limits: 400 partial 1 MB bodies took it from 57 to 450 MB resident, and
it stayed at 442 MB once they were gone; with the threshold pinned at 64 KiB
(uvicorn reads a body in pieces of 64-256 KiB) it went back to 63 MB.

Pinning the threshold is one ``mallopt`` call, which also turns glibc's dynamic
adjustment off; it is made through ctypes, Python's only way to it. Elsewhere
(musl, macOS, Windows) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD_BYTES", "return_freed_buffers_to_os"]

logger = logging.getLogger("stormguard_server.memory")

MMAP_THRESHOLD_BYTES = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>


def return_freed_buffers_to_os(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Allocations of ``threshold`` bytes or more get their own mapping, unmapped on
    free. True when glibc took the setting."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, threshold))
    logger.debug("malloc mmap threshold pinned at %d bytes: %s", threshold, done)
    return done
