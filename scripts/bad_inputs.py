"""Tries bad inputs on `rlft train` as a careless user would, and prints a table: exit status, lines printed
on stderr, seconds to fail, and the last line. Every row should end in one `rlft: error:` line, fast.

    python scripts/bad_inputs.py                 # all probes (about 10 minutes on 2 cores)
    python scripts/bad_inputs.py --only data     # the probes whose name contains "data"

Each probe runs in its own temporary folder (its files are made there) and its own run directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHORT = ["trainer.steps=2", "trainer.prompts_per_step=4", "algo.group_size=2", "data.eval_size=10",
         "logger.console=false"]

# name -> (overrides, files to write in the probe's folder {name: text or bytes}, environment)
PROBES: dict[str, tuple[list[str], dict, dict]] = {}


def probe(name: str, *overrides: str, files: dict | None = None, env: dict | None = None) -> None:
    PROBES[name] = (list(overrides), files or {}, env or {})


for key in ("optim.lr", "algo.eps_high", "algo.eps_low", "algo.kl_coef", "rollout.temperature", "rollout.top_p",
            "optim.eps", "optim.weight_decay", "optim.max_grad_norm", "reward.timeout_s",
            "algo.router_aux_loss_coef", "algo.clip_ratio_c", "algo.tis_cap"):
    for value in ("nan", "inf", "-inf", "-1"):
        probe(f"config {key}={value}", f"{key}={value}")
for override in ("optim.betas=[0.9,nan]", "optim.betas=[1.0,0.9]", "optim.betas=[0.9]", "optim.warmup_steps=-1",
                 "trainer.steps=0", "trainer.prompts_per_step=0", "trainer.eval_every=0", "trainer.save_every=-3",
                 "trainer.keep_checkpoints=0", "trainer.epochs=nan", "trainer.max_nonfinite_steps=0",
                 "algo.group_size=1", "algo.ppo_epochs=0", "algo.max_sampling_rounds=0", "rollout.max_new_tokens=0",
                 "rollout.max_new_tokens=100000000", "rollout.max_batch_size=0", "rollout.async_steps=2",
                 "data.eval_size=-1", "data.eval_size=100000", "data.split_seed=-5", "seed=-1",
                 "seed=99999999999999999999999", "trainer.prompts_per_step=100000000", "model.path=",
                 "model.path=/no/such/folder", "model.path=builtin:nope", "model.lora.r=0",
                 "model.lora.target_modules=[qkv]", "model.lora.alpha=nan", "compute.micro_batch_size=0",
                 "compute.attn_implementation=flash_attention_2", "compute.layout=sideways", "algo.loss_agg=nope",
                 "algo.routing_replay=true", "reward.fns=[]", "reward.fns=[nope]", "reward.weights=[1,2]",
                 "reward.weights=[inf]", "reward.on_error=ignore", "data.path=my.jsonl", "+algo.eps_hgih=0.3",
                 "algo.lr=1e-5", "data=dataset", "data=nope", "algo=[grpo]", "~algo.kl_coef", "--bogus",
                 "hardware.learner_ranks=0", "hardware=cpu_ray hardware.ray_address=127.0.0.1:1",
                 "reward=code_tests reward.sandbox_memory_mb=8", "data=countdown data.max_operand=0"):
    probe(f"config {override}", *override.split())
probe("env OMP_NUM_THREADS=two", env={"OMP_NUM_THREADS": "two"})

ROW = '{"prompt": "1+1=", "answer": "2"}\n'
for name, text in {
    "null answer": '{"prompt": "1+1=", "answer": null}\n',
    "list prompt": '{"prompt": ["1+1="], "answer": "2"}\n',
    "dict answer": '{"prompt": "1+1=", "answer": {"v": 2}}\n',
    "bool answer": '{"prompt": "1+1=", "answer": true}\n',
    "empty prompt": '{"prompt": "  ", "answer": "2"}\n',
    "missing key": '{"question": "1+1=", "answer": "2"}\n',
    "torn json": ROW + '{"prompt": "2+2=", "ans',
    "array line": '["1+1=", "2"]\n',
    "latin-1 bytes": ROW.encode() + '{"prompt": "caf\u00e9", "answer": "2"}\n'.encode("latin-1"),
    "empty file": "",
}.items():
    probe(f"data jsonl {name}", "data=dataset", "data.path=d.jsonl", files={"d.jsonl": text})
probe("data csv short row", "data=dataset", "data.path=d.csv", files={"d.csv": "prompt,answer,x\n1+1=,2,a\n2+2=,4\n"})
probe("data csv empty answer", "data=dataset", "data.path=d.csv", files={"d.csv": "prompt,answer\n1+1=,\n"})
probe("data unknown format", "data=dataset", "data.path=d.txt", files={"d.txt": "1+1=2\n"})
probe("data missing file", "data=dataset", "data.path=/no/such.jsonl")
probe("reward module syntax error", "reward.fns=[badmod:f]", files={"badmod.py": "def f(completion):\n  return 1 +\n"})
probe("reward module raises on import", "reward.fns=[badmod:f]", files={"badmod.py": "x = 1 / 0\n"})
probe("reward function missing", "reward.fns=[goodmod:nope]", files={"goodmod.py": "def f(completion):\n  return 1.0\n"})
probe("reward returns a string", "reward.fns=[strmod:f]", files={"strmod.py": "def f(completion):\n  return '1'\n"})
probe("reward hangs", "reward.fns=[hangmod:f]", "reward.timeout_s=1",
      files={"hangmod.py": "import time\ndef f(completion):\n  time.sleep(60)\n  return 1.0\n"})
probe("map_fn raises", "data=dataset", "data.path=d.jsonl", "data.map_fn=mapmod:f",
      files={"d.jsonl": ROW, "mapmod.py": "def f(row):\n  raise KeyError('q')\n"})


def run(name: str, folder: Path) -> dict:
    overrides, files, env = PROBES[name]
    for file, content in files.items():
        (folder / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlft.cli", "train", f"hydra.run.dir={folder / 'run'}", *SHORT,
                           *overrides], cwd=folder, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"PYTHONPATH": str(folder), "TQDM_DISABLE": "1"} | env)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return {"probe": name, "rc": proc.returncode, "lines": len(lines), "seconds": round(time.monotonic() - started, 1),
            "last": lines[-1][:160] if lines else proc.stdout.strip().splitlines()[-1][:160]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the probes whose name contains this")
    parser.add_argument("--jsonl", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in [n for n in PROBES if args.only in n]:
        with tempfile.TemporaryDirectory(prefix="rlft-probe-") as folder:
            rows.append(run(name, Path(folder)))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print("| probe | exit | stderr lines | seconds | last line |\n|---|---:|---:|---:|---|")
    for r in rows:
        print(f"| `{r['probe']}` | {r['rc']} | {r['lines']} | {r['seconds']} | {r['last'].replace('|', '/')} |")
    clean = sum(r["rc"] == 2 and r["lines"] == 1 and r["last"].startswith("rlft: error:") for r in rows)
    print(f"\n{clean} of {len(rows)} probes ended in exactly one `rlft: error:` line")


if __name__ == "__main__":
    main()
