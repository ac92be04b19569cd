import ctypes
import platform

import pytest

from rlft.tooling.allocator import reuse_freed_memory


def heap_range() -> tuple[int, int]:
    """[start, end) of this process's brk heap."""
    for line in open("/proc/self/maps"):
        if "[heap]" in line:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            return start, end
    return 0, 0


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_after_it_a_large_block_comes_from_the_heap_and_stays_there():
    size = 200 << 20  # glibc's own threshold is at most 32 MB: by default this block is a fresh mmap
    if reuse_freed_memory() < size:
        pytest.skip("this glibc allows an mmap threshold of 32 MB at most")
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    block = libc.malloc(size)
    start, end = heap_range()
    assert start <= block and block + size <= end  # from the heap, not an mmap of its own
    libc.free(block)
    assert heap_range()[1] >= block + size  # kept after free: the heap was not trimmed below it
