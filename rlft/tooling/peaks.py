"""This machine's measured peaks (scripts/measure_peaks.py writes them once), read back for the perf/
fractions. A run never measures: without a cached file it logs its FLOPs and no fractions."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from rlft.config import RunConfig
from rlft.models.gguf import cache_root
from rlft.tooling.flops import Roof


@dataclass(frozen=True)
class Peaks:
    """The best a device did on large matrix products and on reading memory."""

    device: str                       # "cpu" or "cuda"
    name: str                         # the CPU model or GPU name it was measured on
    threads: int                      # torch threads (CPU): the trainer's default, the cores it may use
    date: str                         # ISO date of the measurement
    matmul_gflops: dict[str, float]   # dtype name ("float32", "bfloat16") -> GFLOP/s of a large square matmul
    read_gbps: float                  # GB/s reading a tensor much larger than the caches

    def roof(self, dtype: str, devices: int = 1) -> Roof | None:
        """What `devices` such devices do computing in `dtype`; None when that dtype's matmul was not
        measured (another dtype's peak would misstate the fraction)."""
        if dtype not in self.matmul_gflops:
            return None
        return Roof(devices * self.matmul_gflops[dtype] * 1e9, devices * self.read_gbps * 1e9)


def peaks_file(device: str) -> Path:
    return cache_root() / f"peaks-{device}.json"


def load_peaks(device: str) -> Peaks | None:
    """The cached peaks of `device`, or None when they were never measured here."""
    path = peaks_file(device)
    return Peaks(**json.loads(path.read_text())) if path.is_file() else None


def save_peaks(peaks: Peaks) -> Path:
    path = peaks_file(peaks.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(peaks), indent=2) + "\n")
    return path


def run_roofs(cfg: RunConfig) -> dict[str, Roof] | None:
    """Each phase's roof in a run of `cfg` (rlft.tooling.flops.PHASES), from the cached peaks of its device
    in its compute dtype; None without them. Generation runs on the engines' devices, the rest on the
    learner's; on CPU every actor shares the one machine that was measured."""
    peaks = load_peaks(str(cfg.hardware.device))
    if peaks is None:
        return None
    h, gpus = cfg.hardware, str(cfg.hardware.device) == "cuda"
    learner = h.learner_ranks if h.ray and gpus else 1
    engines = h.rollout_workers * h.gpus_per_rollout_worker if h.ray and gpus else 1
    engine_roof, learner_roof = peaks.roof(str(cfg.model.dtype), engines), peaks.roof(str(cfg.model.dtype), learner)
    if engine_roof is None or learner_roof is None:
        return None
    return {"generate": engine_roof, "reference": learner_roof, "forward": learner_roof, "backward": learner_roof}
