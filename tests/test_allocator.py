import ctypes
import platform

import pytest

from rlft.tooling.allocator import KEEP_BYTES, reuse_freed_memory


def heap_mb() -> int:
    for line in open("/proc/self/maps"):
        if "[heap]" in line:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            return (end - start) >> 20
    return 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_after_it_a_large_block_comes_from_the_heap_and_stays_there():
    assert reuse_freed_memory()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    size = 200 << 20
    assert size < KEEP_BYTES
    before = heap_mb()
    block = libc.malloc(size)  # glibc's default would mmap this: the heap would not grow
    grown = heap_mb()
    libc.free(block)
    assert grown - before > 150 and heap_mb() >= grown - 1  # kept after free, not trimmed
