"""This machine's peaks, measured once and cached: the best GFLOP/s of large square matrix products (float32,
and bfloat16 where it runs in reasonable time) and the GB/s of reading a tensor far larger than the caches.
Every later run reads them (rlft.tooling.peaks) for its perf/*_peak_fraction and perf/step_floor_* metrics;
no run measures by itself.

    python scripts/measure_peaks.py                 # CPU, torch threads = the cores this process may use
    python scripts/measure_peaks.py --device cuda   # the GPU
    python scripts/measure_peaks.py --print         # the cached table

The cache is $RLFT_CACHE/peaks-DEVICE.json (RLFT_CACHE defaults to ~/.cache/rlft). Measure on an idle
machine: anything else running lowers the peaks and so raises every fraction against them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rlft.tooling.peaks import Peaks, load_peaks, peaks_file, save_peaks  # noqa: E402  (run from a checkout)

# --size: (matmul side, MB read) per device. tiny is for tests: it measures caches, not memory.
SIZES = {"full": {"cpu": (2048, 512), "cuda": (8192, 4096)}, "tiny": {"cpu": (64, 1), "cuda": (64, 1)}}
SLOW_SECONDS = 5.0  # a dtype whose first product takes longer has no fast kernel here: not measured


def best_seconds(run, device: str, repeats: int) -> float:
    """The fastest of `repeats` timed calls, after one untimed (allocation, kernel choice)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(device: str, dtype: torch.dtype, n: int, repeats: int) -> float | None:
    """2 n^3 FLOPs per n x n product; None when a small product's rate says one n x n product would take
    longer than SLOW_SECONDS (no fast kernel for the dtype here, e.g. bfloat16 on many CPUs)."""
    def rate(side: int, tries: int) -> float:
        a, b = (torch.randn(side, side, device=device).to(dtype) for _ in range(2))
        return 2 * side ** 3 / best_seconds(lambda: a @ b, device, tries)
    if 2 * n ** 3 / rate(min(n, 256), 3) > SLOW_SECONDS:
        return None
    return rate(n, repeats) / 1e9


def read_gbps(device: str, megabytes: int, repeats: int) -> float:
    """Summing a float32 tensor reads each byte once and does one add per 4: bound by memory reads."""
    x = torch.ones(megabytes * 2 ** 20 // 4, device=device)
    return x.numel() * 4 / best_seconds(x.sum, device, repeats) / 1e9


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    with open("/proc/cpuinfo") as cpuinfo:  # Linux; elsewhere what platform knows
        return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                    platform.processor())


def measure(device: str, size: str, repeats: int) -> Peaks:
    from rlft.preflight import torch_threads  # here: it imports transformers, which --print never needs

    threads = torch_threads(default=len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)  # as the trainer sets them
    side, megabytes = SIZES[size][device]
    matmul = {name: matmul_gflops(device, dtype, side, repeats)
              for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    return Peaks(device=device, name=device_name(device), threads=threads, date=datetime.date.today().isoformat(),
                 matmul_gflops={name: value for name, value in matmul.items() if value is not None},
                 read_gbps=read_gbps(device, megabytes, repeats))


def table(peaks: Peaks) -> str:
    lines = [f"{peaks.device}: {peaks.name}, {peaks.threads} torch threads, measured {peaks.date}",
             "| peak | value |", "|---|---:|"]
    lines += [f"| {dtype} matmul | {gflops:.1f} GFLOP/s |" for dtype, gflops in peaks.matmul_gflops.items()]
    return "\n".join(lines + [f"| memory read | {peaks.read_gbps:.2f} GB/s |"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="full", help="tiny: a second, for tests")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--print", action="store_true", help="print the cached peaks, measure nothing")
    args = parser.parse_args(argv)
    if args.print:
        peaks = load_peaks(args.device)
        if peaks is None:
            raise SystemExit(f"no peaks cached for {args.device} ({peaks_file(args.device)}): "
                             f"run scripts/measure_peaks.py --device {args.device}")
        print(table(peaks))
        return
    peaks = measure(args.device, args.size, args.repeats)
    path = save_peaks(peaks)
    print(table(peaks))
    print(f"cached in {path}")


if __name__ == "__main__":
    main()
