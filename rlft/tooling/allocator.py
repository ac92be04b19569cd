"""Keep freed memory in the process, so that a training step reuses its pages instead of faulting in new ones.

glibc serves each allocation above its mmap threshold (at most 32 MB, and it adapts) with a fresh
`mmap` and hands it back to the kernel on free; every step then faults in and zeroes its activations,
logits and KV cache again, page by page. On this project's 2-core VM that was a quarter of a SmolLM2
step (docs/bench_vs_trl.md). Raising the mmap and trim thresholds keeps those pages for the next
tensor, as PyTorch's own CUDA caching allocator does on a GPU. The resident set stays near the step's
peak (which it reaches anyway) instead of falling between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's mallopt parameters (malloc.h)
KEEP_BYTES = 1 << 30                          # allocations up to 1 GiB come from the heap; 1 GiB of free top kept
OLD_GLIBC_MMAP_MAX = 32 << 20                 # glibc before 2.35 refuses an mmap threshold above this


def reuse_freed_memory() -> int:
    """Raise glibc's mmap and trim thresholds for this process: the mmap threshold set, in bytes (32 MB
    where an older glibc refuses 1 GiB), or 0 where nothing changed (not glibc, or refused)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return 0
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES):
        return 0
    for threshold in (KEEP_BYTES, OLD_GLIBC_MMAP_MAX):
        if libc.mallopt(M_MMAP_THRESHOLD, threshold):
            return threshold
    return 0
