"""When does GRPO break on mixture-of-experts, and do GSPO and routing replay hold it? (docs/stability.md)

One `rlft train` process per run, each pinned to a core of its own (taskset), as many at a time as the machine
has cores. Results are JSONL (resumable: a finished run is not run again), then a markdown table per axis and
figures drawn by `rlft compare`.

    .venv/bin/python scripts/stability_study.py                  # the small grid (about 10 minutes on 2 cores)
    .venv/bin/python scripts/stability_study.py --grid full      # the full grid, 3 seeds (about 1 h 45 min)
    .venv/bin/python scripts/stability_study.py --grid full --report-only --figures docs/
    .venv/bin/python scripts/stability_study.py --grid full --results docs/stability_results.jsonl --report-only
                                             # the tables and figures of docs/stability.md from its data alone

The regime: 40 steps of 32 prompts x 8 responses on the built-in addition task, 8 PPO epochs (8 optimizer steps
per batch: far off-policy by the last; micro-batches of 64), lr 1e-3; a held-out evaluation every 10 steps.
The axes, around that base:
  core      model (tiny_moe, tiny_adder) x algorithm (grpo, dapo, gspo, gspo_token, cispo) x KL (0, 0.04)
  replay    tiny_moe x (grpo, gspo) x routing replay (R2 = learner, R3 = rollout) x KL (0, 0.04)
  pressure  tiny_moe x (grpo, gspo) x KL 0 x (ppo_epochs 1, ppo_epochs 4, lr 3e-4, staleness k = 2 with TIS)
A run counts as collapsed when its held-out accuracy at the end is at most half its best evaluation; rlft's
collapse rule (trainer.stop_on_collapse's, on the train reward, logged every step as collapse/fired; the runs
are not stopped) is scored against that.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rlft.tooling.metrics import PANELS  # noqa: E402
from rlft.tooling.monitor import read_metrics  # noqa: E402
BASE = ["trainer.steps=40", "trainer.prompts_per_step=32", "algo.group_size=8", "algo.ppo_epochs=8",
        "compute.micro_batch_size=64", "optim.lr=1e-3", "trainer.eval_every=10", "trainer.save_every=1000",
        "logger.console=false"]
ALGOS = {"grpo": ["algo=grpo"], "dapo": ["algo=dapo"], "gspo": ["algo=gspo"],
         "gspo_token": ["algo=gspo", "algo.ratio_level=sequence_token"], "cispo": ["algo=cispo"]}
REPLAY = {"off": [], "R2": ["algo.routing_replay=learner"], "R3": ["algo.routing_replay=rollout"]}
PRESSURE = {"base": [], "epochs1": ["algo.ppo_epochs=1"], "epochs4": ["algo.ppo_epochs=4"],
            "lr3e-4": ["optim.lr=3e-4"], "k2_tis": ["rollout.max_staleness=2", "algo.correction.kind=token_tis"]}
MODELS = {"moe": "tiny_moe", "dense": "tiny_adder"}
CURVES = [metric for metric, _, _ in PANELS] + ["collapse/reward_drop", "collapse/fired"]  # kept per step
# the indicators compared between runs that collapse and runs that do not: (metric, label)
INDICATORS = [("train/approx_kl", "old-new KL"), ("train/clip_frac", "clip fraction"), ("train/entropy", "entropy"),
              ("train/grad_norm", "grad norm"), ("moe/routing_drift", "routing drift"),
              ("rollout/logprob_diff_mean", "engine-learner log-prob gap")]


def grid(name: str, seeds: list[int]) -> list[dict]:
    """Every run of the grid: its axes (what the tables group by) and seed."""
    runs = []

    def add(axis, model, algo, kl, replay="off", pressure="base"):
        for seed in seeds:
            runs.append({"axis": axis, "model": model, "algo": algo, "kl": kl, "replay": replay,
                         "pressure": pressure, "seed": seed})

    if name == "small":
        for model, algo, kl in itertools.product(["moe"], ["grpo", "gspo"], [0.0, 0.04]):
            add("core", model, algo, kl)
        for algo in ("grpo", "gspo"):
            add("core", "dense", algo, 0.0)
            add("replay", "moe", algo, 0.0, replay="R2")
        return runs
    for model, algo, kl in itertools.product(MODELS, ALGOS, [0.0, 0.04]):
        add("core", model, algo, kl)
    for algo, replay, kl in itertools.product(["grpo", "gspo"], ["R2", "R3"], [0.0, 0.04]):
        add("replay", "moe", algo, kl, replay=replay)
    for algo, pressure in itertools.product(["grpo", "gspo"], ["epochs1", "epochs4", "lr3e-4", "k2_tis"]):
        add("pressure", "moe", algo, 0.0, pressure=pressure)
    return sorted(runs, key=lambda run: run["seed"])  # every configuration's first seed first: a cut-short grid says most


def run_name(run: dict) -> str:
    """The run directory's name: its overrides, so `rlft compare` labels its line by them."""
    parts = [f"model={MODELS[run['model']]}", f"algo={run['algo']}", f"kl={run['kl']:g}"]
    parts += [f"replay={run['replay']}"] * (run["replay"] != "off") + [f"pressure={run['pressure']}"] * (run["pressure"] != "base")
    return ",".join([*parts, f"seed={run['seed']}"])


def overrides(run: dict) -> list[str]:
    return [*BASE, f"model={MODELS[run['model']]}", *ALGOS[run["algo"]], f"algo.kl_coef={run['kl']}",
            *REPLAY[run["replay"]], *PRESSURE[run["pressure"]], f"seed={run['seed']}"]


def summarize(run: dict, run_dir: Path) -> dict:
    """The run's numbers for the tables, and what `restore` needs to draw it again: its options line and the
    per-step values of `rlft compare`'s panels."""
    rows = read_metrics(run_dir / "metrics.jsonl")  # non-finite values come back as floats
    evals = [r for r in rows if r.get("kind") == "eval"]
    steps = [r for r in rows if r.get("kind") != "eval" and "train/loss" in r]
    fired = [r["step"] for r in rows if r.get("collapse/fired")]
    accuracy = [(r["step"], r["eval/accuracy"]) for r in evals]
    out = run | {"name": run_name(run), "accuracy": accuracy, "start": accuracy[0][1], "end": accuracy[-1][1],
                 "best": max(a for _, a in accuracy), "fired_at": fired[0] if fired else None,
                 "seconds": sum(r.get("perf/step_seconds", 0.0) for r in rows)}
    out["options"] = (run_dir / "config.yaml").read_text().split("\n", 1)[0]
    out["rows"] = [{key: r[key] for key in ("step", "kind", *CURVES) if key in r and _finite(r[key])} for r in rows]
    # each indicator's mean over the first 5 steps and over the 5 steps before the rule fired (or the last 5)
    before = [r for r in steps if r["step"] < (out["fired_at"] or 10 ** 9)][-5:]
    for metric, _ in INDICATORS:
        early = [r[metric] for r in steps[:5] if r.get(metric) is not None and math.isfinite(r[metric])]
        late = [r[metric] for r in before if r.get(metric) is not None and math.isfinite(r[metric])]
        out[f"early:{metric}"] = statistics.mean(early) if early else None
        out[f"before:{metric}"] = statistics.mean(late) if late else None
    return out


def _finite(value) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def restore(results: list[dict], out: Path) -> None:
    """Run directories `rlft compare` can read (the panels' metrics and the options line), for the runs whose
    directory is not here: a results file alone (docs/stability_results.jsonl) draws the figures again."""
    for result in results:
        run_dir = out / "runs" / result["name"]
        if (run_dir / "metrics.jsonl").exists():
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(f"{result['options']}\nseed: {result['seed']}\n")
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in result["rows"]))


def run_all(runs: list[dict], out: Path, cores: list[int]) -> None:
    """Each run pinned to a free core; a finished run's summary appended to results.jsonl at once."""
    todo, running, failed = list(runs), {}, []
    while todo or running:
        for core in [c for c in cores if c not in running and todo]:
            run = todo.pop(0)
            run_dir = out / "runs" / run_name(run)
            if run_dir.exists():  # cut short earlier: start again from nothing
                shutil.rmtree(run_dir)
            log = open(out / "logs" / f"{run_name(run)}.log", "w")
            command = ["taskset", "-c", str(core), str(ROOT / ".venv/bin/rlft"), "train", f"hydra.run.dir='{run_dir}'",
                       *overrides(run)]
            running[core] = (run, run_dir, subprocess.Popen(command, stdout=log, stderr=log, cwd=ROOT), log)
        time.sleep(1)
        for core, (run, run_dir, process, log) in list(running.items()):
            if process.poll() is None:
                continue
            log.close()
            del running[core]
            if process.returncode != 0:
                failed.append(f"{run_name(run)} failed: see {out / 'logs' / (run_name(run) + '.log')}")
                continue
            summary = summarize(run, run_dir)
            with open(out / "results.jsonl", "a") as f:
                f.write(json.dumps(summary) + "\n")
            print(f"{summary['name']}: held-out {summary['start']:.2f} -> {summary['end']:.2f}, collapse rule "
                  f"{'fired at step ' + str(summary['fired_at']) if summary['fired_at'] else 'quiet'}", flush=True)
    if failed:
        sys.exit("\n".join(failed))


def collapsed(result: dict) -> bool:
    """Held-out accuracy at the end at most half its best (a run that learned, then lost it)."""
    return result["end"] <= 0.5 * result["best"]


def _mean(values) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.2f}{spread}"


def _median(values) -> str:
    """Median [lowest, highest] over runs: one run's gradient spike does not move it."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return "-"
    return f"{statistics.median(values):.3g} [{values[0]:.3g}, {values[-1]:.3g}]"


def tables(results: list[dict]) -> str:
    """Per axis, per configuration (seeds folded): held-out accuracy, collapses, the rule's first firing."""
    out = []
    for axis in ("core", "replay", "pressure"):
        rows = [r for r in results if r["axis"] == axis]
        if not rows:
            continue
        out += [f"### {axis}", "", "| model | algo | KL | replay | pressure | seeds | held-out start | at step 10 | "
                "end | best | collapsed | rule fired (steps) | mean clip fraction, steps 1-5 |",
                "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
        configs = sorted({(r["model"], r["algo"], r["kl"], r["replay"], r["pressure"]) for r in rows})
        for config in configs:
            rs = [r for r in rows if (r["model"], r["algo"], r["kl"], r["replay"], r["pressure"]) == config]
            at10 = [dict(map(tuple, r["accuracy"])).get(10) for r in rs]
            fired = sorted(r["fired_at"] for r in rs if r["fired_at"] is not None)
            model, algo, kl, replay, pressure = config
            out.append(f"| {model} | {algo} | {kl:g} | {replay} | {pressure} | {len(rs)} | "
                       f"{_mean(r['start'] for r in rs)} | {_mean(at10)} | {_mean(r['end'] for r in rs)} | "
                       f"{_mean(r['best'] for r in rs)} | {sum(map(collapsed, rs))}/{len(rs)} | "
                       f"{', '.join(map(str, fired)) or '-'} | {_mean(r['early:train/clip_frac'] for r in rs)} |")
        out.append("")
    return "\n".join(out)


def indicator_table(results: list[dict]) -> str:
    """What precedes a collapse: each indicator's per-run mean over the first 5 steps and the 5 before the rule
    fired (runs where it never fired: the last 5), the median over runs that collapsed and runs that did not,
    MoE and dense apart."""
    lines = ["| model | indicator | collapsed: steps 1-5 | not: steps 1-5 | collapsed: 5 steps before the rule fired | "
             "not: 5 steps before firing, or the last 5 |", "|---|---|---:|---:|---:|---:|"]
    for model in ("moe", "dense"):
        rs = [r for r in results if r["model"] == model]
        if not rs:
            continue
        fell, held = [r for r in rs if collapsed(r)], [r for r in rs if not collapsed(r)]
        lines.append(f"| {model} ({len(fell)} collapsed of {len(rs)}) | | | | | |")
        for metric, label in INDICATORS:
            if all(r.get(f"early:{metric}") is None for r in rs):
                continue
            lines.append(f"| {model} | {label} | {_median(r[f'early:{metric}'] for r in fell)} | "
                         f"{_median(r[f'early:{metric}'] for r in held)} | "
                         f"{_median(r[f'before:{metric}'] for r in fell)} | "
                         f"{_median(r[f'before:{metric}'] for r in held)} |")
    return "\n".join(lines)


def rule_table(results: list[dict]) -> str:
    """The collapse rule (train reward) against the held-out verdict: hits, misses, false alarms, and how the
    rule's first firing compares with the first evaluation at most half the best."""
    hits = [r for r in results if collapsed(r) and r["fired_at"] is not None]
    misses = [r for r in results if collapsed(r) and r["fired_at"] is None]
    alarms = [r for r in results if not collapsed(r) and r["fired_at"] is not None]
    leads = []
    for r in hits:
        best = max(a for _, a in r["accuracy"])
        peak = next(step for step, a in r["accuracy"] if a == best)
        shown = next((step for step, a in r["accuracy"] if step > peak and a <= 0.5 * best), None)
        if shown is not None:
            leads.append(shown - r["fired_at"])
    lead = f"{statistics.mean(leads):+.1f}" if leads else "-"
    fell = [r for r in results if collapsed(r)]
    held = [r for r in results if not collapsed(r)]
    early = "; ".join(
        f"early old-new KL (steps 1-5) above {limit}: {sum((r['early:train/approx_kl'] or 0) > limit for r in fell)}"
        f"/{len(fell)} collapsed runs, {sum((r['early:train/approx_kl'] or 0) > limit for r in held)}/{len(held)} "
        "that held" for limit in (0.1, 0.15, 0.2))
    return ("| runs | collapsed (held-out) | rule fired on them | missed | fired on a run that held | "
            "steps from the rule's firing to the held-out evaluation that showed the collapse (mean) |\n"
            "|---:|---:|---:|---:|---:|---:|\n"
            f"| {len(results)} | {len(hits) + len(misses)} | {len(hits)} | {len(misses)} | {len(alarms)} | {lead} |"
            f"\n\nA leading signal, for comparison: {early}.")


def figures(results: list[dict], out: Path, into: Path) -> list[Path]:
    """`rlft compare` over each axis's runs (seeds folded into a mean line with a min-max band)."""
    drawn = []
    groups = {"core_moe": lambda r: r["axis"] == "core" and r["model"] == "moe",
              "core_dense": lambda r: r["axis"] == "core" and r["model"] == "dense",
              "replay": lambda r: r["axis"] == "replay" or (r["axis"] == "core" and r["model"] == "moe"
                                                          and r["algo"] in ("grpo", "gspo")),
              "pressure": lambda r: r["axis"] == "pressure" or (r["axis"] == "core" and r["model"] == "moe"
                                                              and r["algo"] in ("grpo", "gspo") and r["kl"] == 0)}
    for name, member in groups.items():
        dirs = [out / "runs" / r["name"] for r in results if member(r) and (out / "runs" / r["name"]).exists()]
        if not dirs:
            continue
        png = into / f"stability_{name}.png"
        subprocess.run([str(ROOT / ".venv/bin/rlft"), "compare", *map(str, dirs), "-o", str(png)], check=True,
                       stdout=subprocess.DEVNULL)
        drawn.append(png)
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", choices=["small", "full"], default="small")
    parser.add_argument("--seeds", default=None, help="comma-separated (default: 0 for small, 0,1,2 for full)")
    parser.add_argument("--out", type=Path, default=None, help="default: runs/stability_GRID")
    parser.add_argument("--figures", type=Path, default=None, help="where the figures go (default: OUT)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--results", type=Path, default=None,
                        help="start from this results file (docs/stability_results.jsonl): its runs are not run again")
    args = parser.parse_args()
    seeds = [int(s) for s in (args.seeds or ("0" if args.grid == "small" else "0,1,2")).split(",")]
    out = (args.out or ROOT / "runs" / f"stability_{args.grid}").resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"

    def read() -> list[dict]:
        return [json.loads(line) for line in results_path.read_text().splitlines()] if results_path.exists() else []

    if args.results is not None and not results_path.exists():
        shutil.copy(args.results, results_path)
    runs = grid(args.grid, seeds)
    restore(read(), out)
    if not args.report_only:
        done = {r["name"] for r in read()}
        run_all([r for r in runs if run_name(r) not in done], out, sorted(os.sched_getaffinity(0)))
    wanted = {run_name(r) for r in runs}
    results = [r for r in read() if r["name"] in wanted]
    print(tables(results))
    print("### what precedes a collapse\n")
    print(indicator_table(results))
    print("\n### the collapse rule against the held-out verdict\n")
    print(rule_table(results))
    for png in figures(results, out, args.figures or out):
        print(f"figure: {png}")


if __name__ == "__main__":
    main()
