"""The guards of issue 21 around the trainer: non-finite values kept out of the config, the weights and the
disk; model problems found before loading; resume from crash leftovers; one run per directory; signals."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT, TINY_RUN, read_metrics
from rlft.checkpoint import latest_checkpoint, save_checkpoint
from rlft.config import validate
from rlft.config.checks import every_number_finite
from rlft.config.compose import compose, to_run_config
from rlft.errors import ConfigError, NonFiniteWeights, UserError
from rlft.learner.policy import Policy
from rlft.models.checks import check_context, check_lora_targets, check_weight_files, read_model_config, shape_of
from rlft.models.loading import load_causal_lm, resolve_model_path
from rlft.preflight import check_memory
from rlft.registry import import_function
from rlft.run_dir import RunLock, check_unused
from rlft.tooling.monitor import Monitor, read_metrics as read_rows, truncate_metrics
from rlft.types import TrainerState
from test_learner import SETTINGS, batch_and_path

TINY = resolve_model_path("builtin:tiny-adder")


def config(*overrides: str):
    return to_run_config(*compose(list(overrides)))


# ---- the config: NaN and infinities pass `x <= 0`; every key is bounded ----------------------------------

@pytest.mark.parametrize("override, message", [
    ("optim.lr=nan", "optim.lr must be a finite number > 0 (got nan)"),
    ("optim.lr=inf", "optim.lr must be a finite number > 0 (got inf)"),
    ("algo.eps_high=nan", "algo.eps_high must be >= 0 (got nan)"),
    ("algo.kl_coef=inf", "algo.kl_coef must be >= 0 (got inf)"),
    ("optim.betas=[0.9,nan]", "optim.betas[1] must be in [0, 1) (got nan)"),
    ("algo.overlong.penalty=inf", "algo.overlong.penalty must be >= 0 (got inf)"),
    ("algo.tis_cap=inf", "algo.tis_cap must be a finite number (got inf)"),
    ("optim.max_grad_norm=-1", "optim.max_grad_norm must be a finite number > 0 (got -1.0)"),
    ("optim.weight_decay=-0.1", "optim.weight_decay must be >= 0 (got -0.1)"),
    ("optim.eps=0", "optim.eps must be a finite number > 0 (got 0.0)"),
    ("rollout.max_batch_size=0", "rollout.max_batch_size must be >= 1 (got 0)"),
    ("data.eval_size=-1", "data.eval_size must be >= 1 (got -1)"),
    ("seed=-1", "seed must be in [0, 9223372036854775807] (got -1)"),
    ("data.split_seed=-5", "data.split_seed must be in [0, 9223372036854775807] (got -5)"),
    ("trainer.max_nonfinite_steps=0", "trainer.max_nonfinite_steps must be >= 1 (got 0)"),
])
def test_every_number_is_bounded_and_finite(override, message):
    with pytest.raises(ConfigError) as caught:
        validate(config(override))
    assert str(caught.value) == message


def test_the_finiteness_walk_reaches_every_nested_number():
    cfg = config("data=reasoning_gym")
    every_number_finite(cfg)
    cfg.data.tasks["chain_sum"] = float("nan")
    with pytest.raises(ConfigError, match=r"^data.tasks.chain_sum must be a finite number \(got nan\)$"):
        every_number_finite(cfg)
    cfg = config()
    cfg.optim.betas = [0.9, float("-inf")]
    with pytest.raises(ConfigError, match=r"^optim.betas\[1\] must be a finite number \(got -inf\)$"):
        every_number_finite(cfg)


# ---- the model, from its config.json and file headers, before any weights load ---------------------------

def test_a_truncated_weights_file_is_named_before_loading(tmp_path):
    shutil.copytree(TINY, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50_000])
    with pytest.raises(ConfigError, match=r"model.safetensors: 50000 bytes, but its tensors need \d+ \(a truncated"):
        check_weight_files(str(tmp_path / "m"))
    check_weight_files(TINY)  # the whole one passes


def test_a_config_without_a_model_type_is_one_line(tmp_path):
    shutil.copytree(TINY, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    del meta["model_type"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"config.json: not a model config transformers can read \(Unrecognized"):
        read_model_config(str(tmp_path / "m"))


def test_context_lora_targets_and_memory_are_checked_against_the_model():
    shape = shape_of(read_model_config(TINY))
    check_context(shape, 8)
    with pytest.raises(ConfigError, match=r"rollout.max_new_tokens=64 leaves no room for a prompt: the model's context "
                                          r"is 64 tokens"):
        check_context(shape, 64)
    with pytest.raises(ConfigError, match=r"model.lora.target_modules: qkv not in the model \(its linear layers: "):
        check_lora_targets(read_model_config(TINY), ["q_proj", "qkv"])
    check_memory(config(), shape)  # the default run fits
    with pytest.raises(ConfigError, match=r"a step needs at least [\d.]+ GiB .* but this machine has"):
        check_memory(config("trainer.prompts_per_step=100000000"), shape)


def test_a_user_module_that_does_not_import_is_named_with_its_line(tmp_path, monkeypatch):
    (tmp_path / "broken_syntax.py").write_text("def f(completion):\n    return 1 +\n")
    (tmp_path / "broken_import.py").write_text("x = 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"broken_syntax.py:2: SyntaxError: invalid syntax"):
        import_function("broken_syntax:f", "reward")
    with pytest.raises(ConfigError, match=r"importing 'broken_import' raised ZeroDivisionError: .*broken_import.py:1"):
        import_function("broken_import:f", "reward")


# ---- the learner: a non-finite step is not applied; diverged weights stop the run --------------------------

def test_a_non_finite_loss_is_not_applied():
    path, batch = batch_and_path()
    policy = Policy(load_causal_lm(path, "float32", "cpu"), ppo_epochs=2)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    batch.advantages = torch.full_like(batch.advantages, float("nan"))
    stats = policy.update(batch, SETTINGS, lr=1e-3)
    assert stats.skipped_updates == 2 and stats.nonfinite == "loss = nan" and math.isnan(stats.grad_norm)
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters())
    assert all(not state for state in policy.optimizer.state.values())  # AdamW's moments untouched too


def test_weights_that_diverge_stop_the_update():
    """Finite loss and gradients can still step to infinite weights (an optimizer step that overflows)."""
    path, batch = batch_and_path()
    policy = Policy(load_causal_lm(path, "float32", "cpu"))
    step = policy.optimizer.step
    policy.optimizer.step = lambda: (step(), policy.params[3].data.mul_(float("inf")))
    with pytest.raises(NonFiniteWeights, match="the weights are not finite after the optimizer step"):
        policy.update(batch, SETTINGS, lr=1e-3)


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path):
    state = TrainerState(step=2, sampler_position=0, rollout_rng=torch.zeros(4, dtype=torch.uint8),
                         torch_rng=torch.get_rng_state())
    good = {"w": torch.ones(3)}
    save_checkpoint(tmp_path, good, {"state": {}, "param_groups": []}, state, keep=1)
    bad = {"w": torch.tensor([1.0, float("inf"), 0.0])}
    with pytest.raises(NonFiniteWeights, match="w is not finite"):
        save_checkpoint(tmp_path, bad, {"state": {}, "param_groups": []},
                        TrainerState(3, 0, state.rollout_rng, state.torch_rng), keep=1)
    assert latest_checkpoint(tmp_path).name == "step_000002"  # still there, not pruned
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()] == ["step_000002"]


# ---- metrics.jsonl: non-finite values are visible; a torn last line does not break resume ------------------

def test_non_finite_metrics_are_written_as_strings_and_read_back(tmp_path):
    monitor = Monitor(tmp_path, 3, 0, console=False)
    monitor.log({"step": 1, "train/loss": float("nan"), "train/grad_norm": float("inf"), "x": 1.0})
    line = (tmp_path / "metrics.jsonl").read_text()
    assert '"train/loss": "nan"' in line and '"train/grad_norm": "inf"' in line and "null" not in line
    row = read_rows(tmp_path / "metrics.jsonl")[0]
    assert math.isnan(row["train/loss"]) and row["train/grad_norm"] == math.inf and row["x"] == 1.0


def test_a_torn_last_metrics_line_is_dropped_and_a_damaged_one_named(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    truncate_metrics(path, last_step=2)
    assert "a torn last line" in capsys.readouterr().err
    assert [r["step"] for r in read_rows(path)] == [1, 2] and path.read_text().endswith("}\n")
    path.write_text('{"step": 1}\n{"step": 2, "a"\n{"step": 3}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:2: not a metrics row"):
        read_rows(path)


# ---- checkpoints: the step folders are the truth -----------------------------------------------------------

def _checkpoints(run_dir: Path, steps) -> None:
    for step in steps:
        state = TrainerState(step=step, sampler_position=step, rollout_rng=torch.zeros(4, dtype=torch.uint8),
                             torch_rng=torch.get_rng_state())
        save_checkpoint(run_dir, {"w": torch.full((64,), float(step))}, {"state": {}, "param_groups": []}, state,
                        keep=5)


def test_resume_falls_back_from_a_damaged_or_missing_newest_checkpoint(tmp_path, capsys):
    _checkpoints(tmp_path, [2, 4, 6])
    root = tmp_path / "checkpoints"
    weights = root / "step_000006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated by a crash or a full disk
    assert latest_checkpoint(tmp_path).name == "step_000004"
    assert "step_000006 is not usable (model.safetensors: " in capsys.readouterr().err
    (root / "latest").write_text("step_000009")  # a pointer to a folder that is gone
    shutil.rmtree(root / "step_000006")
    assert latest_checkpoint(tmp_path).name == "step_000004"


def test_a_kill_between_the_rename_and_the_pointer_keeps_the_new_checkpoint(tmp_path):
    _checkpoints(tmp_path, [2])
    (tmp_path / "checkpoints" / "latest").unlink()  # the first checkpoint's rename done, its pointer not yet
    assert latest_checkpoint(tmp_path).name == "step_000002"
    shutil.rmtree(tmp_path / "checkpoints" / "step_000002")
    assert latest_checkpoint(tmp_path) is None  # nothing to resume: the run starts again


# ---- the run directory: one run at a time, never a fresh run over an old one -------------------------------

def test_a_run_directory_is_locked_and_a_used_one_refused_for_a_fresh_run(tmp_path):
    check_unused(tmp_path)
    with RunLock(tmp_path):
        with pytest.raises(ConfigError, match=rf"{tmp_path} is in use by another rlft run \(pid {os.getpid()}\)"):
            with RunLock(tmp_path):
                pass
    with RunLock(tmp_path):  # released
        pass
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ConfigError, match=r"already holds a run \(metrics.jsonl\): continue it with rlft train resume="):
        check_unused(tmp_path)


# ---- end to end: the guards as a user meets them -----------------------------------------------------------

def rlft_proc(*args, env=None, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "rlft.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"TQDM_DISABLE": "1"} | (env or {}),
                            **kwargs)


def test_non_finite_steps_are_skipped_then_stop_the_run_with_its_last_good_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = rlft_proc("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=8", "trainer.save_every=2",
                     env={"RLFT_FAULT_NAN_LOSS_AT_UPDATES": "3,5,6,7"})
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlft: error: loss = nan: 1 of 1 updates not applied (3 such step(s) in a row; "
                           "trainer.max_nonfinite_steps=3) [step 7; the checkpoint of step 6 is intact"), err
    assert "rlft: warning: step 3: loss = nan" in err  # the first one was skipped, and the run went on
    rows = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    assert [r["train/skipped_updates"] for r in rows] == [0, 0, 1, 0, 1, 1]
    assert '"train/loss": "nan"' in (run / "metrics.jsonl").read_text()
    for folder in (run / "checkpoints").glob("step_*"):
        assert all(torch.isfinite(t).all() for t in load_file(folder / "model.safetensors").values())


def test_a_fresh_run_into_a_used_directory_is_refused_and_resume_takes_it(tmp_path, rlft):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=2")
    rows = (run / "metrics.jsonl").read_text()
    proc = subprocess.run([sys.executable, "-m", "rlft.cli", "train", f"hydra.run.dir={run}", *TINY_RUN,
                           "trainer.steps=2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.startswith(f"rlft: error: {run} already holds a run (config.yaml, "
                                                           "metrics.jsonl, checkpoints, final_model)"), proc.stderr
    assert (run / "metrics.jsonl").read_text() == rows  # nothing appended


def wait_for(predicate, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_sigterm_during_training_ends_in_one_line_naming_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = rlft_proc("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=100000", "trainer.save_every=2")
    wait_for(lambda: (run / "checkpoints" / "step_000002").is_dir() or proc.poll() is not None)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("rlft: error: interrupted during step ")
    assert f"is intact: rlft train resume={run}" in err


def test_sigterm_during_start_up_is_one_line(tmp_path):
    """The data's map_fn announces that start-up is under way, then waits to be stopped."""
    (tmp_path / "slow_map.py").write_text(
        "import pathlib, time\n"
        f"def row(r):\n    pathlib.Path({str(tmp_path / 'started')!r}).touch()\n    time.sleep(600)\n")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    proc = rlft_proc("train", f"hydra.run.dir={tmp_path / 'run'}", "data=dataset", f"data.path={tmp_path / 'd.jsonl'}",
                     "data.map_fn=slow_map:row", env={"PYTHONPATH": str(tmp_path)})
    wait_for(lambda: (tmp_path / "started").exists() or proc.poll() is not None)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err == "rlft: error: interrupted during start-up\n", err
    assert not (tmp_path / "run").exists()  # nothing was written
