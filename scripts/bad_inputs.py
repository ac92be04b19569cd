"""Tries bad inputs on `rlft train` as a careless user would, and prints a table: exit status, lines printed
on stderr, seconds to fail, and the last line. Every row should end in one `rlft: error:` line, fast; the
few probes marked `ok` are inputs that look odd but are fine, and must train (exit 0, no error line).

    python scripts/bad_inputs.py                           # all probes (about 20 minutes on 2 cores)
    python scripts/bad_inputs.py --only data               # the probes whose name contains "data"
    python scripts/bad_inputs.py --markdown docs/bad_inputs.md   # also write the table and its summary there

Each probe runs in its own temporary folder (its files are made there) and its own run directory. A probe's
`setup` makes what plain files cannot (a copied model folder, a read-only or tiny run directory, a damaged
run to resume); `limits` are resource limits of the rlft process (resource.RLIMIT_*). Run as root, the
read-only directory is a read-only bind mount (root ignores file modes) and the full disk a 1 MiB tmpfs;
both are unmounted after the probe.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
TINY_ADDER = ROOT / "rlft" / "models" / "tiny_adder"
SHORT = ["trainer.steps=2", "trainer.prompts_per_step=4", "algo.group_size=2", "data.eval_size=10",
         "logger.console=false"]
TIMEOUT_S = 600


@dataclass
class Probe:
    overrides: list[str]
    files: dict = field(default_factory=dict)   # name (may hold folders) -> text or bytes, in the probe's folder
    env: dict = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None  # called with the probe's folder after its files are written
    limits: dict = field(default_factory=dict)  # resource.RLIMIT_* -> limit, in the rlft process
    ok: bool = False                            # a fine input: it must train


PROBES: dict[str, Probe] = {}
MOUNTS: list[Path] = []  # what a probe's setup mounted, unmounted after it


def probe(name: str, *overrides: str, files: dict | None = None, env: dict | None = None,
          setup: Callable[[Path], None] | None = None, limits: dict | None = None, ok: bool = False) -> None:
    assert name not in PROBES, name
    PROBES[name] = Probe(list(overrides), files or {}, env or {}, setup, limits or {}, ok)


class SkipProbe(Exception):
    """This machine cannot set the probe up (a mount without root)."""


# ---- setup helpers

def copy_model(folder: Path, name: str = "m", drop: tuple[str, ...] = (), edit: dict | None = None) -> Path:
    """The built-in tiny-adder model copied to folder/name, less `drop`, with `edit` merged into config.json."""
    target = folder / name
    shutil.copytree(TINY_ADDER, target, ignore=shutil.ignore_patterns(*drop, "sft_curve.json"))
    if edit:
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(config | edit))
    return target


def read_only(path: Path) -> None:
    """A directory nothing can be written into: mode 555, and for root (whom modes do not stop) a read-only
    bind mount."""
    path.mkdir(exist_ok=True)
    path.chmod(0o555)
    if os.geteuid() == 0:
        mount(["--bind", str(path), str(path)], path)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)


def tiny_disk(path: Path, size: str = "1m") -> None:
    """A file system of `size` at `path` (a tmpfs; needs root)."""
    if os.geteuid() != 0:
        raise SkipProbe("mounting a tmpfs needs root")
    path.mkdir(exist_ok=True)
    mount(["-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], path)


def mount(args: list[str], path: Path) -> None:
    subprocess.run(["mount", *args], check=True)
    MOUNTS.append(path)


def unmount_all() -> None:
    while MOUNTS:
        subprocess.run(["umount", str(MOUNTS.pop())], check=False)


def saved_run(folder: Path, *overrides: str) -> Path:
    """folder/run as a run leaves it: config.yaml as rlft writes it (its options line first), for resume."""
    run = folder / "run"
    run.mkdir()
    job = subprocess.run([sys.executable, "-m", "rlft.cli", "train", "--cfg", "job", *SHORT, *overrides],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    (run / "config.yaml").write_text(job.stdout)
    return run

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


# ---- more data files: formats and defects (ROWS: 24 good rows, enough to train on)
ROWS = "".join(f'{{"prompt": "{a}+{a + 1}=", "answer": "{2 * a + 1}"}}\n' for a in range(10, 34))
CSV = "prompt,answer\n" + "".join(f"{a}+{a + 1}=,{2 * a + 1}\n" for a in range(10, 34))
DATASET = ("data=dataset",)


def data_probe(name: str, file: str, content, *overrides: str, **options) -> None:
    probe(f"data {name}", *DATASET, f"data.path={file}", *overrides, files={file: content} | options.pop("files", {}),
          **options)


data_probe("csv ragged row", "d.csv", CSV + "2+2=,4,extra\n")
data_probe("csv header only", "d.csv", "prompt,answer\n")
data_probe("csv latin-1 bytes", "d.csv", CSV.encode() + "caf\u00e9,2\n".encode("latin-1"))
data_probe("csv whitespace-only prompt", "d.csv", CSV + "   ,2\n")
data_probe("csv NUL byte", "d.csv", CSV.encode() + b"1+1=\x00,2\n")
data_probe("parquet that is text", "d.parquet", CSV)
AS_OBJECT = {"rows": [json.loads(row) for row in ROWS.splitlines()]}
data_probe("json object not array", "d.json", json.dumps(AS_OBJECT, indent=2))
data_probe("json object on one line", "d.json", json.dumps(AS_OBJECT))
data_probe("json bool answer", "d.json", '[{"prompt": "1+1=", "answer": false}]')
HALF = len(ROWS) // 2
data_probe("jsonl blank line in the middle", "d.jsonl", ROWS[:HALF] + "\n  \n" + ROWS[HALF:], ok=True)
data_probe("jsonl trailing garbage line", "d.jsonl", ROWS + "EOF\n")
data_probe("jsonl trailing garbage after an object", "d.jsonl", ROWS + '{"prompt": "1+1=", "answer": "2"} ,\n')
data_probe("jsonl NUL byte", "d.jsonl", ROWS.encode() + b'{"prompt": "1+1=", "answer": "2"}\x00\n')
data_probe("jsonl UTF-16", "d.jsonl", ROWS.encode("utf-16"))
data_probe("jsonl gzip-compressed", "d.jsonl", __import__("gzip").compress(ROWS.encode()))
data_probe("jsonl tab-newline prompt", "d.jsonl", ROWS + '{"prompt": "\\t\\n ", "answer": "2"}\n')
HUGE = json.dumps({"prompt": "1+" * 5_000_000 + "1=", "answer": "1"})  # a 10 MB prompt: dropped as too long
data_probe("jsonl huge single line", "d.jsonl", ROWS + HUGE + "\n", ok=True)
data_probe("jsonl one line holding an array", "d.jsonl", json.dumps([json.loads(r) for r in ROWS.splitlines()] * 5000))
data_probe("jsonl prompt_key absent", "d.jsonl", ROWS, "data.prompt_key=question")
data_probe("jsonl prompt_key = answer_key", "d.jsonl", ROWS, "data.answer_key=prompt")
data_probe("jsonl eval_split of a file", "d.jsonl", ROWS, "data.eval_split=test")
data_probe("jsonl split of a file", "d.jsonl", ROWS, "data.split=validation")
data_probe("jsonl eval_path missing", "d.jsonl", ROWS, "data.eval_path=test.jsonl")
data_probe("jsonl eval_path empty", "d.jsonl", ROWS, "data.eval_path=test.jsonl", files={"test.jsonl": ""})
data_probe("map_fn missing module", "d.jsonl", ROWS, "data.map_fn=nosuchmod:f")
data_probe("map_fn syntax error", "d.jsonl", ROWS, "data.map_fn=mapmod:f",
           files={"mapmod.py": "def f(row)\n  return row\n"})
data_probe("map_fn returns a list", "d.jsonl", ROWS, "data.map_fn=mapmod:f",
           files={"mapmod.py": "def f(row):\n  return [row['prompt'], row['answer']]\n"})
data_probe("map_fn returns None", "d.jsonl", ROWS, "data.map_fn=mapmod:f",
           files={"mapmod.py": "def f(row):\n  row['prompt'] = row['prompt'].strip()\n"})
data_probe("map_fn with a dot for the colon", "d.jsonl", ROWS, "data.map_fn=mapmod.f",
           files={"mapmod.py": "def f(row):\n  return row\n"})
data_probe("map_fn calls sys.exit", "d.jsonl", ROWS, "data.map_fn=mapmod:f",
           files={"mapmod.py": "import sys\ndef f(row):\n  sys.exit('bad row')\n"})
data_probe("map_fn not a function", "d.jsonl", ROWS, "data.map_fn=mapmod:f", files={"mapmod.py": "f = {'prompt': 1}\n"})
probe("data folder without data files", *DATASET, "data.path=rows", files={"rows/README.md": "my rows\n"})
probe("data empty folder", *DATASET, "data.path=rows", setup=lambda folder: (folder / "rows").mkdir())
probe("data folder named like a file", *DATASET, "data.path=d.jsonl", setup=lambda folder: (folder / "d.jsonl").mkdir())


def parquet_with_bool_answers(folder: Path) -> None:
    import pyarrow
    import pyarrow.parquet
    table = pyarrow.table({"prompt": [f"{a}+1=" for a in range(20)], "answer": [a % 2 == 0 for a in range(20)]})
    pyarrow.parquet.write_table(table, folder / "d.parquet")


probe("data parquet bool answer", *DATASET, "data.path=d.parquet", setup=parquet_with_bool_answers)

# ---- user reward modules
probe("reward fn is not callable", "reward.fns=[rmod:f]", files={"rmod.py": "f = 1.0\n"})
probe("reward fn wrong signature", "reward.fns=[rmod:f]", files={"rmod.py": "def f(text, reference):\n  return 1.0\n"})
probe("reward fn async", "reward.fns=[rmod:f]", files={"rmod.py": "async def f(completion):\n  return 1.0\n"})
probe("reward fn a generator", "reward.fns=[rmod:f]", files={"rmod.py": "def f(completion):\n  yield 1.0\n"})
probe("reward fn returns None", "reward.fns=[rmod:f]", files={"rmod.py": "def f(completion):\n  print(completion)\n"})
probe("reward module exits on import", "reward.fns=[rmod:f]",
      files={"rmod.py": "import sys\nsys.exit(3)\ndef f(completion):\n  return 1.0\n"})
probe("reward module indentation error", "reward.fns=[rmod:f]", files={"rmod.py": "def f(completion):\nreturn 1.0\n"})
probe("reward module imports a missing package", "reward.fns=[rmod:f]",
      files={"rmod.py": "import nosuchpackage\ndef f(completion):\n  return 1.0\n"})
probe("reward accuracy fn raises", "reward.fns=[exact_match]", "reward.accuracy=rmod:f",
      files={"rmod.py": "def f(completion):\n  raise ValueError('no score')\n"})

# ---- model folders (copies of the built-in tiny-adder, damaged)
MODEL = ("model.path=m",)
probe("model config.json not JSON", *MODEL,
      setup=lambda f: (copy_model(f) / "config.json").write_text("{model_type: qwen2"))
probe("model config.json unknown model_type", *MODEL, setup=lambda f: copy_model(f, edit={"model_type": "nope"}))
probe("model without weights", *MODEL, setup=lambda f: copy_model(f, drop=("*.safetensors",)))
probe("model without tokenizer files", *MODEL, setup=lambda f: copy_model(f, drop=("tokenizer*",)))
probe("model vocab_size unlike its weights", *MODEL, setup=lambda f: copy_model(f, edit={"vocab_size": 30}))
probe("model more layers than its weights", *MODEL, setup=lambda f: copy_model(f, edit={"num_hidden_layers": 6,
                                                                                         "layer_types": None}))


def truncated_weights(folder: Path) -> None:
    weights = copy_model(folder) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1_000_000])


probe("model truncated safetensors", *MODEL, setup=truncated_weights)
probe("model path is the weights file", "model.path=m/model.safetensors", setup=copy_model)
probe("model empty folder", *MODEL, setup=lambda f: (f / "m").mkdir())
probe("model gguf that is text", "model.path=./m.gguf", files={"m.gguf": "not a gguf\n"})

# ---- the run directory, resume
probe("run dir is a regular file", files={"run": "notes\n"})
probe("run dir is read-only", setup=lambda f: read_only(f / "run"))
probe("run dir under a regular file", "hydra.run.dir=notes/run", files={"notes": "notes\n"})
probe("resume a folder that is not a run", "resume=notrun", setup=lambda f: (f / "notrun").mkdir())
probe("resume a missing folder", "resume=/no/such/run")
probe("resume a file", "resume=notes", files={"notes": "notes\n"})


def damaged_checkpoint(folder: Path) -> None:
    step = saved_run(folder) / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step.parent / "latest").write_text(step.name)
    for name in ("model.safetensors", "trainer_state.safetensors"):
        (step / name).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b"\x00" * 14)
    (step / "trainer_state.json").write_text('{"step": 2')


probe("resume a run whose checkpoint is damaged", "resume=run", setup=damaged_checkpoint)
probe("resume a run whose config.yaml is damaged", "resume=run",
      setup=lambda f: (saved_run(f) / "config.yaml").write_text("# options: algo=grpo\nalgo: [\n"))

# ---- a full disk mid-run (the checkpoint of step 1 does not fit)
probe("disk full: 1 MiB tmpfs run dir", "trainer.save_every=1", setup=lambda f: tiny_disk(f / "run"))
probe("disk full: RLIMIT_FSIZE 1 MiB", "trainer.save_every=1", limits={resource.RLIMIT_FSIZE: 2 ** 20})

# ---- Ray start-up
probe("ray address: a closed port", "hardware=cpu_ray", "hardware.ray_address=127.0.0.1:6390")
probe("ray address: auto without a cluster", "hardware=cpu_ray", "hardware.ray_address=auto")
probe("ray address: unroutable", "hardware=cpu_ray", "hardware.ray_address=10.255.255.1:6379")
probe("ray address: no port", "hardware=cpu_ray", "hardware.ray_address=headnode")
probe("ray address: port out of range", "hardware=cpu_ray", "hardware.ray_address=127.0.0.1:99999")

# ---- other careless commands
probe("config a sweep without -m", "optim.lr=1e-5,1e-4")
probe("config a stray word", "trainer.steps=3", "quickly")
probe("config the same key twice", "trainer.steps=3", "trainer.steps=2", ok=True)  # in order: the last one holds
probe("config trainer.steps=2.5", "trainer.steps=2.5")
probe("config hardware.device=cuda without a GPU", "hardware.device=cuda")
probe("config rollout=vllm without vllm", "rollout=vllm",  # hidden where it is installed
      files={"vllm.py": "raise ImportError(\"No module named 'vllm'\")\n"})
probe("config trainer.exit_after_step past the end", "trainer.exit_after_step=5")
probe("config model hub id offline", "model.path=nobody/no-such-model", env={"HF_HUB_OFFLINE": "1"})
probe("config data hub id offline", *DATASET, "data.path=nobody/no-such-dataset", env={"HF_HUB_OFFLINE": "1"})


def run(name: str, folder: Path) -> dict:
    p = PROBES[name]
    for file, content in p.files.items():
        (folder / file).parent.mkdir(parents=True, exist_ok=True)
        (folder / file).write_bytes(content if isinstance(content, bytes) else content.encode())
    try:
        if p.setup is not None:
            p.setup(folder)
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", "rlft.cli", "train", f"hydra.run.dir={folder / 'run'}",
                                   *SHORT, *p.overrides], cwd=folder, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  stdin=subprocess.DEVNULL, preexec_fn=limiter(p.limits) if p.limits else None,
                                  env=os.environ | {"PYTHONPATH": str(folder), "TQDM_DISABLE": "1"} | p.env)
            rc, stderr, stdout = proc.returncode, proc.stderr, proc.stdout
        except subprocess.TimeoutExpired as err:
            rc, stderr, stdout = "timeout", _text(err.stderr), _text(err.stdout)
    except SkipProbe as why:
        return {"probe": name, "expect": "ok" if p.ok else "error", "rc": "skipped", "lines": 0, "seconds": 0.0,
                "last": str(why)}
    finally:
        unmount_all()
    lines = [line for line in stderr.splitlines() if line.strip()]
    out = stdout.strip().splitlines()
    return {"probe": name, "expect": "ok" if p.ok else "error", "rc": rc, "lines": len(lines),
            "seconds": round(time.monotonic() - started, 1),
            "last": (lines[-1] if lines else out[-1] if out else "")[:160]}


def limiter(limits: dict) -> Callable[[], None]:
    def apply() -> None:
        for which, limit in limits.items():
            resource.setrlimit(which, (limit, limit))
    return apply


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def as_expected(row: dict) -> bool:
    """An error probe ends in one `rlft: error:` line (exit 2, or 130 when stopped); an `ok` probe trains."""
    if row["expect"] == "ok":
        return row["rc"] == 0 and not row["last"].startswith("rlft: error:")
    return row["rc"] == 2 and row["lines"] == 1 and row["last"].startswith("rlft: error:")


def table(rows: list[dict]) -> str:
    lines = ["| probe | expect | exit | stderr lines | seconds | last line |", "|---|---|---:|---:|---:|---|"]
    for r in rows:
        last = r["last"].replace("|", "\\|")
        lines.append(f"| `{r['probe']}` | {r['expect']} | {r['rc']} | {r['lines']} | {r['seconds']} | {last} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    done = [r for r in rows if r["rc"] != "skipped"]
    errors = [r for r in done if r["expect"] == "error"]
    oks = [r for r in done if r["expect"] == "ok"]
    seconds = [r["seconds"] for r in errors] or [0.0]
    failing = [r["probe"] for r in done if not as_expected(r)]
    text = (f"{len(rows)} probes: {sum(map(as_expected, errors))} of {len(errors)} bad inputs ended in exactly one "
            f"`rlft: error:` line, {sum(map(as_expected, oks))} of {len(oks)} fine inputs trained; seconds to fail: "
            f"median {statistics.median(seconds):.1f}, max {max(seconds):.1f}")
    skipped = len(rows) - len(done)
    if skipped:
        text += f"; {skipped} skipped (this machine cannot set them up)"
    if failing:
        text += "\nnot as expected: " + ", ".join(f"`{name}`" for name in failing)
    return text


MARKDOWN_INTRO = """# Bad inputs to `rlft train`

Every bad input to `rlft train` (a config override, a data file, a model folder, a reward module, the run
directory, the disk, Ray, the environment) should end in exactly one `rlft: error: ...` line on stderr,
quickly, before any work; the few rows marked `ok` are inputs that look odd but are fine, and train. This
table is written by

    python scripts/bad_inputs.py --markdown docs/bad_inputs.md

(about 20 minutes on 2 cores; `--only TEXT` runs the probes whose name contains TEXT). Each probe runs
`rlft train` with a short run ({short}) in a fresh temporary folder. Machine: {machine}. Date: {date}.

{summary}

The disk fills mid-run two ways: a 1 MiB tmpfs mounted over the run directory (as root), and a 1 MiB file size
limit (RLIMIT_FSIZE, what `ulimit -f` sets) on the rlft process; both with trainer.save_every=1, so the
checkpoint of step 1 is what does not fit. The read-only run directory is a read-only bind mount (root ignores
file modes). "seconds" is the wall time of the whole command, Python's and torch's start-up included; the
median and the maximum above are over the bad inputs. An unroutable Ray address fails at rlft's connect bound
(30 s), or sooner where a proxy answers for every address: one that answers HTTP/2 (as where this table was
made, if that probe's line names a GCS error) leaves Ray's client to fail, in about 20 s.

"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the probes whose name contains this")
    parser.add_argument("--jsonl", type=Path, help="also write the rows here")
    parser.add_argument("--markdown", type=Path, help="also write the table, with an introduction, here")
    parser.add_argument("--date", default=time.strftime("%Y-%m-%d"), help="the date written in --markdown's intro")
    args = parser.parse_args()
    rows = []
    for name in [n for n in PROBES if args.only in n]:
        with tempfile.TemporaryDirectory(prefix="rlft-probe-") as folder:
            try:
                rows.append(run(name, Path(folder)))
            finally:
                for path in Path(folder).rglob("*"):  # a read-only folder would stop the clean-up
                    if path.is_dir() and not path.is_symlink():
                        path.chmod(0o755)
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{table(rows)}\n\n{summary(rows)}")
    if args.markdown:
        machine = (f"{os.cpu_count()} CPU cores, {platform.system()} {platform.machine()}, "
                   f"Python {platform.python_version()}")
        intro = MARKDOWN_INTRO.format(short=" ".join(SHORT), machine=machine, date=args.date, summary=summary(rows))
        args.markdown.write_text(intro + table(rows) + "\n")


if __name__ == "__main__":
    main()
