"""Keep the memory one image job frees for the next, instead of faulting it in again.

An image job allocates and frees tens of megabytes: the input's bytes, the decoded
picture, the resized one. glibc serves blocks that large with fresh `mmap`s (or
trims the heap once they are freed), so every job touches new pages, which the
kernel zeroes on the first fault: a share of every image job's time that a process
keeping its freed memory does not pay (docs/benchmarks.md, "Other measurements").
With large blocks from the heap and the heap trimmed only above TRIM_THRESHOLD_BYTES
of free memory at its top, a worker child keeps up to that much for its next job;
the worker's memory ceiling (worker/memory_limit.py) bounds it all the same.

What the `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` environment variables
do, set from the image runner's warm-up, before the worker forks (the children
inherit it). glibc only: elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap: glibc's own ceiling for its dynamic threshold.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Tune this process's malloc to keep freed blocks (glibc); whether it did."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    done = all(
        libc.mallopt(parameter, value) == 1
        for parameter, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        )
    )
    if not done:
        logger.warning("mallopt refused the image runner's thresholds; left as they were")
    return done
