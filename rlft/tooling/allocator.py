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


def reuse_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False where the C library is not glibc
    (nothing changes there)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(libc.mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
