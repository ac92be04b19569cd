"""A cost model of one RL step at 8, 64 and 512 GPUs for 7B and 32B models (docs/scaling.md).

    .venv/bin/python scripts/scaling_model.py                      # the table of docs/scaling.md
    .venv/bin/python scripts/scaling_model.py --measured runs/X     # also the time split measured in a run

One step = generate (decode is memory-bound: every token reads the weights and the KV cache), then train
(compute-bound: 6 x params x tokens FLOPs, plus 2 x params x tokens per extra forward pass), then the
weight sync (bytes over the interconnect). With rollout.max_staleness=k >= 1 generation of step t+1 overlaps
the training of step t: the step takes the longer of the two, and the samples are up to k versions stale.
With partial rollouts (rollout.partial_rollouts=true) the engine keeps its batch full of sequences (unfinished
ones carry over to the next step), so a step decodes for about the mean response length, not the longest;
its producer runs k - 1 steps ahead, so at k = 1 generation and training take turns and at k = 2 they overlap.

The hardware figures are datasheet peaks times an efficiency; the efficiencies are the knobs a measurement
sets (--measured reads a run's metrics.jsonl and prints its own split to compare with).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Model:
    name: str
    params: float          # parameters
    layers: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> float:  # K and V, every layer
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops: float       # dense peak
    hbm_bytes_per_s: float
    hbm_bytes: float
    nvlink_bytes_per_s: float   # per GPU, one direction, within a node
    network_bytes_per_s: float  # per GPU, across nodes (InfiniBand / RoCE)
    gpus_per_node: int = 8
    mfu: float = 0.40           # training: achieved / peak FLOPs (FSDP, bf16, long sequences)
    decode_efficiency: float = 0.55  # decoding: achieved / peak HBM bandwidth (vLLM, large batches)
    link_efficiency: float = 0.70    # broadcast / all-gather: achieved / peak link bandwidth


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int
    group_size: int
    prompt_len: int
    response_len_mean: int
    response_len_max: int   # a step waits for its longest response
    kl: bool = True         # a reference forward pass
    ppo_epochs: int = 1     # 1: old log-probs come free with the first pass (rlft.learner)

    @property
    def samples(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclass(frozen=True)
class Placement:
    gpus: int
    learner_gpus: int
    rollout_tp: int         # GPUs per vLLM engine (tensor parallel)

    @property
    def rollout_gpus(self) -> int:
        return self.gpus - self.learner_gpus

    @property
    def engines(self) -> int:
        return self.rollout_gpus // self.rollout_tp


MODELS = {"7B": Model("7B", 7.6e9, 28, 4, 128), "32B": Model("32B", 32.8e9, 64, 8, 128)}
H100 = GPU("H100 SXM", bf16_flops=989e12, hbm_bytes_per_s=3.35e12, hbm_bytes=80e9, nvlink_bytes_per_s=450e9,
           network_bytes_per_s=50e9)
H200 = GPU("H200 SXM", bf16_flops=989e12, hbm_bytes_per_s=4.8e12, hbm_bytes=141e9, nvlink_bytes_per_s=450e9,
           network_bytes_per_s=50e9)

SIZES = (8, 64, 512)
# Weak scaling: the batch (prompts per step) grows with the cluster, 16 prompts per GPU.
WEAK = {gpus: Workload(16 * gpus, 8, 512, 1500, 4096) for gpus in SIZES}
# Strong scaling: one batch of 128 prompts x 8 on every cluster size.
STRONG = {gpus: Workload(128, 8, 512, 1500, 4096) for gpus in SIZES}


def placement_for(model: Model, gpus: int, gpu: GPU) -> Placement | None:
    """Half the GPUs learn (at least enough to hold weights, gradients and Adam state sharded, 16 bytes a
    parameter, in 60% of memory), the rest generate with the fewest tensor-parallel GPUs that fit; None
    when the model does not fit this many GPUs that way."""
    learner = max(gpus // 2, math.ceil(16 * model.params / (0.6 * gpu.hbm_bytes)))
    tp = 1
    while 2 * model.params / tp > 0.5 * gpu.hbm_bytes:  # weights in at most half, the rest for KV cache
        tp *= 2
    if gpus - learner < tp:
        return None
    return Placement(gpus, learner, tp)


def generate_seconds(model: Model, work: Workload, place: Placement, gpu: GPU, partial: bool = False) -> float:
    """Prefill (compute) plus decode (bandwidth): each decode step of an engine reads its weight shard and
    the KV cache of its batch; the engine runs as many waves as its KV memory needs. A wave waits for its
    longest response; with partial rollouts the batch stays full and a step's share of decoding is the
    mean response length (the step's tokens over the sequences in flight)."""
    per_engine = math.ceil(work.samples / place.engines)
    kv_room = place.rollout_tp * gpu.hbm_bytes * 0.9 - 2 * model.params
    context = work.prompt_len + work.response_len_mean
    concurrent = max(1, int(kv_room / (model.kv_bytes_per_token() * context)))
    waves = math.ceil(per_engine / concurrent)
    batch = min(per_engine, concurrent)
    bandwidth = place.rollout_tp * gpu.hbm_bytes_per_s * gpu.decode_efficiency
    # mean context over a response: the prompt and half the response so far
    kv_read = model.kv_bytes_per_token() * batch * (work.prompt_len + work.response_len_mean / 2)
    decode_steps = work.response_len_mean if partial else work.response_len_max
    decode = waves * decode_steps * (2 * model.params + kv_read) / bandwidth
    prefill = 2 * model.params * work.prompt_len * per_engine / (place.rollout_tp * gpu.bf16_flops * gpu.mfu)
    return decode + prefill


def train_seconds(model: Model, work: Workload, place: Placement, gpu: GPU) -> float:
    tokens = work.samples * (work.prompt_len + work.response_len_mean)
    passes = 6 * work.ppo_epochs + (2 if work.kl else 0) + (2 if work.ppo_epochs > 1 else 0)  # ref, old logp
    return passes * model.params * tokens / (place.learner_gpus * gpu.bf16_flops * gpu.mfu)


def sync_seconds(model: Model, place: Placement, gpu: GPU) -> float:
    """FSDP all-gather of the bf16 weights to learner rank 0, then its broadcast to every engine; both
    pipelined, so each costs about bytes / link bandwidth (across nodes once the group spans them)."""
    weights = 2 * model.params
    link = gpu.nvlink_bytes_per_s if place.gpus <= gpu.gpus_per_node else gpu.network_bytes_per_s
    return 2 * weights / (link * gpu.link_efficiency)


def config_keys(place: Placement, work: Workload) -> str:
    keys = [f"hardware.learner_ranks={place.learner_gpus}", f"hardware.rollout_workers={place.engines}",
            f"trainer.prompts_per_step={work.prompts_per_step}"]
    if place.rollout_tp > 1:
        keys += [f"rollout.tensor_parallel_size={place.rollout_tp}",
                 f"hardware.gpus_per_rollout_worker={place.rollout_tp}"]
    if place.gpus > 8:
        keys += ["hardware=multinode", f"hardware.nodes={place.gpus // 8}"]
    else:
        keys.insert(0, "hardware=8gpu")
    return " ".join(keys)


def table(gpu: GPU, workloads: dict[int, Workload]) -> tuple[str, list[str]]:
    rows = ["| model | GPUs | learner / rollout GPUs (tp) | samples/step | generate s | train s | sync s | "
            "step s | step s, async | step s, partial k=1 / k=2 | GPU-h / 1k steps |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = []
    for name, model in MODELS.items():
        for gpus, work in workloads.items():
            place = placement_for(model, gpus, gpu)
            if place is None:
                rows.append(f"| {name} | {gpus} | does not fit: weights, gradients and Adam state need "
                            f"{16 * model.params / 1e9:.0f} GB | | | | | | | | |")
                continue
            gen, train, sync = (generate_seconds(model, work, place, gpu), train_seconds(model, work, place, gpu),
                                sync_seconds(model, place, gpu))
            step, overlapped = gen + train + sync, max(gen, train + sync)
            partial = generate_seconds(model, work, place, gpu, partial=True)
            rows.append(f"| {name} | {gpus} | {place.learner_gpus} / {place.rollout_gpus} ({place.rollout_tp}) | "
                        f"{work.samples:,} | {gen:.0f} | {train:.0f} | {sync:.1f} | {step:.0f} | {overlapped:.0f} | "
                        f"{partial + train + sync:.0f} / {max(partial, train + sync):.0f} | "
                        f"{gpus * step * 1000 / 3600:,.0f} |")
            keys.append(f"- {name}, {gpus} GPUs: `{config_keys(place, work)}`")
    return "\n".join(rows), keys


def measured_split(run_dir: Path) -> str:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") != "eval" and "perf/train_seconds" in r][1:]  # step 1 warms up
    if not steps:
        return f"{run_dir}: no training steps logged"
    mean = {k: sum(r[k] for r in steps) / len(steps) for k in
            ("perf/generate_seconds", "perf/train_seconds", "sync/seconds", "perf/step_seconds", "sync/bytes")}
    total = mean["perf/step_seconds"]
    return (f"measured in {run_dir} ({len(steps)} steps): step {total:.3f} s = generate "
            f"{mean['perf/generate_seconds']:.3f} ({100 * mean['perf/generate_seconds'] / total:.0f}%) + train "
            f"{mean['perf/train_seconds']:.3f} ({100 * mean['perf/train_seconds'] / total:.0f}%) + sync "
            f"{mean['sync/seconds']:.4f} ({100 * mean['sync/seconds'] / total:.1f}%); sync "
            f"{mean['sync/bytes'] / max(mean['sync/seconds'], 1e-9) / 1e6:.0f} MB/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", choices=("h100", "h200"), default="h100")
    parser.add_argument("--measured", type=Path, nargs="*", default=[], help="run directories to summarise")
    args = parser.parse_args()
    gpu = H100 if args.gpu == "h100" else H200
    work = WEAK[8]
    print(f"{gpu.name}: MFU {gpu.mfu}, decode at {gpu.decode_efficiency} of HBM bandwidth, links at "
          f"{gpu.link_efficiency}; {work.group_size} responses per prompt, prompt {work.prompt_len} tokens, "
          f"responses {work.response_len_mean} mean / {work.response_len_max} max, kl on; async = "
          f"rollout.max_staleness=1 (samples one weight version stale); partial = rollout.partial_rollouts=true")
    weak, keys = table(gpu, WEAK)
    strong, _ = table(gpu, STRONG)
    print(f"\nWeak scaling (16 prompts per GPU):\n{weak}\n\nStrong scaling (128 prompts per step at every "
          f"size):\n{strong}\n\nConfig keys at each size (weak scaling):\n" + "\n".join(keys))
    for run_dir in args.measured:
        print("\n" + measured_split(run_dir))


if __name__ == "__main__":
    main()
