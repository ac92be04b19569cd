"""Bounded staleness on this machine, with the engine and the learner on separate cores (the shape of separate
GPUs): steps/s and held-out accuracy for rollout.max_staleness k, with and without partial rollouts, with
no correction, truncated IS and masking, over seeds. Prints a markdown table; results are JSONL (resumable).

    .venv/bin/python scripts/staleness_bench.py                          # the default grid (needs make setup-vllm)
    .venv/bin/python scripts/staleness_bench.py --ks 0,2 --seeds 0 --steps 20 --out runs/staleness_quick

The engine is vLLM's CPU build in its own process (rollout=vllm rollout.in_process=false); a watcher pins
every thread of the trainer's process to core 0 and every thread of its child processes (the engine core,
reward workers) to core 1 with os.sched_setaffinity, again every half second, so threads started later are
pinned too. Each side runs one thread (OMP_NUM_THREADS=1). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORRECTIONS = {"none": [], "tis": ["algo.correction.kind=token_tis"], "mask": ["algo.correction.kind=token_mask"]}
# the default task (3-4 token answers), and multi-turn calculator episodes (a tool call, its output, the answer:
# longer and uneven, the engine waits on the tool between turns)
TASKS = {"arithmetic": [], "calculator": ["env=calculator", "data=calculator", "model=tiny_calculator"]}


def children(pid: int) -> list[int]:
    """Every descendant of pid (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of pid onto cores (a thread's affinity is its own: the process call alone misses them)."""
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for task in tasks:
        try:
            os.sched_setaffinity(task, cores)
        except OSError:
            pass


def watch(proc: subprocess.Popen, stop: threading.Event) -> None:
    while not stop.is_set() and proc.poll() is None:
        pin(proc.pid, {0})
        for child in children(proc.pid):
            pin(child, {1})
        stop.wait(0.5)


def run_one(name: str, overrides: list[str], out: Path, pinned: bool) -> dict:
    run_dir = out / name
    cmd = [str(ROOT / ".venv/bin/rlft"), "train", f"hydra.run.dir={run_dir}", "logger.console=false", *overrides]
    started = time.perf_counter()
    env = os.environ | ({"OMP_NUM_THREADS": "1"} if pinned else {})  # one thread for each side's one core
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out, env=env)
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(proc, stop), daemon=True)
    if pinned:
        watcher.start()
    log, _ = proc.communicate()
    stop.set()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        return {"name": name, "error": log.strip().splitlines()[-1] if log.strip() else f"exit {proc.returncode}"}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") != "eval" and "perf/step_seconds" in r]
    evals = [r for r in rows if r.get("kind") == "eval"]
    timed = steps[2:] or steps  # the first steps warm up (and fill the producer's queue)
    return {"name": name, "wall_seconds": wall,
            "step_seconds": statistics.mean(r["perf/step_seconds"] for r in timed),
            "held_out_start": evals[0]["eval/accuracy"], "held_out_end": evals[-1]["eval/accuracy"],
            "staleness_mean": statistics.mean(r["rollout/staleness"] for r in steps),
            "stale_dropped": sum(r.get("rollout/stale_dropped", 0) for r in steps),
            "carried_groups": sum(r.get("rollout/carried_groups", 0) for r in steps)}


def grid(args) -> list[tuple[str, dict, list[str]]]:
    runs = []
    for task, k, partial, correction, seed in itertools.product(
            args.tasks, args.ks, args.partial, args.corrections, args.seeds):
        if partial == "on" and k < 1:
            continue  # partial rollouts need k >= 1 (a carried token is a version old)
        key = {"task": task, "k": k, "partial": partial, "correction": correction, "seed": seed}
        overrides = [*TASKS[task], "rollout=vllm", "rollout.in_process=false",
                     f"rollout.max_staleness={k}", *CORRECTIONS[correction], f"seed={seed}",
                     f"trainer.steps={args.steps}", f"trainer.eval_every={args.steps}",
                     f"trainer.save_every={args.steps}"]
        if partial == "on":
            overrides += ["rollout.partial_rollouts=true", f"rollout.chunk_tokens={args.chunk_tokens}"]
        runs.append(("_".join(f"{v}" for v in key.values()), key, overrides))
    return runs


def table(results: list[dict]) -> str:
    """Mean (and spread over seeds) per configuration."""
    by_config: dict[tuple, list[dict]] = {}
    for r in results:
        if "error" not in r:
            by_config.setdefault((r["task"], r["k"], r["partial"], r["correction"]), []).append(r)
    lines = ["| task | k | partial | correction | seeds | s/step | steps/s | held-out start -> end | staleness mean | "
             "dropped groups |", "|---|---:|---|---|---:|---:|---:|---|---:|---:|"]
    for (task, k, partial, correction), rs in sorted(by_config.items()):
        sec = statistics.mean(r["step_seconds"] for r in rs)
        ends = [r["held_out_end"] for r in rs]
        spread = f" ± {statistics.stdev(ends):.3f}" if len(ends) > 1 else ""
        lines.append(f"| {task} | {k} | {partial} | {correction} | {len(rs)} | {sec:.3f} | {1 / sec:.2f} | "
                     f"{statistics.mean(r['held_out_start'] for r in rs):.3f} -> {statistics.mean(ends):.3f}{spread} | "
                     f"{statistics.mean(r['staleness_mean'] for r in rs):.2f} | "
                     f"{statistics.mean(r['stale_dropped'] for r in rs):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    words = lambda text: text.split(",")  # noqa: E731
    parser.add_argument("--ks", type=ints, default=[0, 1, 2, 4])
    parser.add_argument("--partial", type=words, default=["off", "on"])
    parser.add_argument("--corrections", type=words, default=list(CORRECTIONS))
    parser.add_argument("--seeds", type=ints, default=[0, 1, 2])
    parser.add_argument("--tasks", type=words, default=list(TASKS))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--chunk-tokens", type=int, default=2)
    parser.add_argument("--no-pin", action="store_true", help="leave the scheduler to place the threads")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "staleness_bench")
    parser.add_argument("--table", action="store_true", help="print the table of every result in --out; run nothing")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines()]))
        return
    if len(os.sched_getaffinity(0)) < 2 and not args.no_pin:
        sys.exit("staleness_bench: pinning needs 2 cores (use --no-pin)")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    results_file = args.out / "results.jsonl"
    done = {}
    if results_file.exists():
        done = {r["name"]: r for r in map(json.loads, results_file.read_text().splitlines()) if "error" not in r}
    results = []
    for name, key, overrides in grid(args):
        if name not in done:
            result = key | run_one(name, overrides, args.out, pinned=not args.no_pin)
            with results_file.open("a") as f:
                f.write(json.dumps(result) + "\n")
            done[name] = result
            status = result.get("error") or f"{result['step_seconds']:.3f} s/step, held-out {result['held_out_end']:.3f}"
            print(f"{name}: {status}", flush=True)
        results.append(done[name])
    print(table(results))


if __name__ == "__main__":
    main()
