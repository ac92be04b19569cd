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
from rlft.distributed.placement import join_ray
from rlft.errors import ConfigError, NonFiniteWeights, UserError
from rlft.learner.policy import Policy
from rlft.models.checks import (check_context, check_lora_targets, check_weight_files, check_weights_match,
                                read_model_config, shape_of)
from rlft.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
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


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of the live processes (zombies are not)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile
            continue
        state, parent = stat.rpartition(")")[2].split()[:2]
        if state != "Z":
            found[int(entry.name)] = (int(parent), command)
    return found


def _descendants(pid: int) -> dict[int, str]:
    table, tree, frontier = _processes(), {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, command) in table.items():
            if ppid == parent and child not in tree:
                tree[child] = command
                frontier.append(child)
    return tree


@pytest.mark.slow
def test_sigterm_while_ray_actors_start_is_one_line_and_leaves_no_ray_process(tmp_path):
    """hardware=cpu_ray starts a local Ray instance; SIGTERM while its actors start (a learner actor's process
    is up, loading the model) ends rlft in one line, status 130, and takes Ray's processes with it."""
    run = tmp_path / "run"
    proc = rlft_proc("train", f"hydra.run.dir={run}", *TINY_RUN, "trainer.steps=2", "hardware=cpu_ray",
                     env={"OMP_NUM_THREADS": "1"})
    wait_for(lambda: proc.poll() is not None or any(command.startswith("ray::LearnerActor")
                                                    for command in _descendants(proc.pid).values()), timeout_s=300)
    assert proc.poll() is None, proc.communicate()
    session = Path(os.readlink(run / "ray_logs")).parent.name  # session_..., in Ray's own processes' arguments
    ray_processes = _descendants(proc.pid)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 60
    # Ray's notice when it starts a local instance comes before; nothing else may
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("Token authentication is")]
    assert proc.returncode == 130 and lines == ["rlft: error: interrupted during start-up"], err
    left = lambda: {pid: command for pid, (_, command) in _processes().items()  # noqa: E731
                    if pid in ray_processes or session in command}
    wait_for(lambda: not left(), timeout_s=30)  # the workers notice their raylet is gone within seconds


# ---- bad inputs found by scripts/bad_inputs.py (docs/bad_inputs.md) ----------------------------------------

def _model_copy(tmp_path, drop=(), **config_changes) -> str:
    shutil.copytree(TINY, tmp_path / "m", ignore=shutil.ignore_patterns(*drop))
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(meta | config_changes))
    return str(tmp_path / "m")


def test_a_model_folder_without_weights_is_named_before_loading(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path '.*m' has no weights \(no .safetensors or pytorch_model.bin"):
        check_weight_files(_model_copy(tmp_path, drop=("*.safetensors",)))


@pytest.mark.parametrize("changes, message", [
    ({"vocab_size": 30}, r"model.safetensors: model.embed_tokens.weight is \[22, 128\] but config.json makes it "
                         r"\[30, 128\] \(does config.json belong to these weights\?\)"),
    ({"num_hidden_layers": 6, "layer_types": None}, r"its weight files lack 24 of the tensors config.json makes "
                                                    r"\(model.layers.4.self_attn.q_proj.weight, "),
])
def test_a_config_json_unlike_its_weights_is_named_before_loading(tmp_path, changes, message):
    path = _model_copy(tmp_path, **changes)
    with pytest.raises(ConfigError, match=message):
        check_weights_match(read_model_config(path), path)


def test_built_in_models_match_their_weights_tied_embeddings_and_fused_experts_included():
    for name in ("builtin:tiny-adder", "builtin:tiny-moe"):  # lm_head tied; MoE experts renamed on loading
        path = resolve_model_path(name)
        check_weights_match(read_model_config(path), path)


def test_a_model_folder_without_tokenizer_files_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"model.path '.*m': no tokenizer there \(its vocabulary is empty"):
        load_tokenizer(_model_copy(tmp_path, drop=("tokenizer*",)))


def test_a_user_module_that_calls_sys_exit_on_import_is_named(tmp_path, monkeypatch):
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing 'exits_on_import' raised SystemExit: 3 "
                                          r"\(.*exits_on_import.py:2\)"):
        import_function("exits_on_import:f", "reward")


@pytest.mark.parametrize("source, message", [
    ("async def f(completion):\n    return 1.0\n", r"reward 'user_fn:f' is an async function"),
    ("def f(completion):\n    yield 1.0\n", r"reward 'user_fn:f' is a generator function"),
    ("def f(text, reference):\n    return 1.0\n", r"reward 'user_fn:f' requires text, reference, which rlft does not "
                                                  r"pass \(it passes by name: answer, completion, level, "),
    ("def f(completion, /):\n    return 1.0\n", r"reward 'user_fn:f' requires completion, which rlft does not pass"),
])
def test_reward_functions_that_cannot_be_called_as_rlft_calls_them_fail_at_start(tmp_path, monkeypatch, source,
                                                                                  message):
    from rlft.preflight import check_reward_functions
    from rlft.rewards.scorer import RewardScorer
    from rlft.types import Problem
    (tmp_path / "user_fn.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_fn", raising=False)  # each case imports its own
    scorer = RewardScorer(config("reward.fns=[user_fn:f]").reward, max_response_tokens=8)
    try:
        with pytest.raises(ConfigError, match=message):
            check_reward_functions(scorer, Problem("1+1=", "2", {"level": 1}))
    finally:
        scorer.close()


def test_reward_functions_taking_what_rlft_passes_pass(tmp_path, monkeypatch):
    from rlft.preflight import check_reward_functions
    from rlft.rewards.scorer import RewardScorer
    from rlft.types import Problem
    (tmp_path / "fine_fn.py").write_text("def f(completion, level, *args, bonus=0.0, **rest):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    scorer = RewardScorer(config("reward.fns=[fine_fn:f,exact_match]").reward, max_response_tokens=8)
    try:
        check_reward_functions(scorer, Problem("1+1=", "2", {"level": 1}))  # a row field by name is passed
    finally:
        scorer.close()


def test_when_no_checkpoint_is_whole_the_error_alone_says_why(tmp_path, capsys):
    _checkpoints(tmp_path, [2, 4])
    for step in ("step_000002", "step_000004"):
        (tmp_path / "checkpoints" / step / "trainer_state.json").write_text('{"step": ')
    with pytest.raises(ConfigError, match=r"none of its 2 checkpoints is whole \(the newest, step_000004: "
                                          r"trainer_state.json: Expecting value"):
        latest_checkpoint(tmp_path)
    assert capsys.readouterr().err == ""  # no warnings before the one error line


def test_a_checkpoint_write_that_fails_for_the_disk_is_an_os_error_naming_the_file(tmp_path):
    """safetensors words a full disk as its own error; the trainer catches OSError (naming the step and the
    checkpoint to resume from). A file size limit (RLIMIT_FSIZE, `ulimit -f`) stands in for a full disk."""
    script = ("import resource, torch\n"
              "from pathlib import Path\n"
              "from rlft.checkpoint import save_checkpoint\n"
              "from rlft.types import TrainerState\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
              "state = TrainerState(step=1, sampler_position=0, rollout_rng=torch.zeros(4, dtype=torch.uint8),\n"
              "                     torch_rng=torch.get_rng_state())\n"
              "try:\n"
              f"    save_checkpoint(Path({str(tmp_path)!r}), {{'w': torch.zeros(65536)}}, "
              "{'state': {}, 'param_groups': []}, state, keep=2)\n"
              "except OSError as err:\n"
              "    print(err.errno, err.strerror, err.filename)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out == f"27 File too large {tmp_path}/checkpoints/.step_000001.tmp/model.safetensors\n"


def test_a_weights_write_that_fails_for_the_disk_is_one_line(monkeypatch, capsys):
    from safetensors import SafetensorError

    import rlft.cli

    def full_disk(*args):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(rlft.cli, "run_one", full_disk)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # train_command's SIGTERM handler: not in pytest
    assert rlft.cli.main(["train"]) == 2
    assert capsys.readouterr().err == "rlft: error: writing weights: No space left on device (os error 28)\n"


def test_every_option_of_every_group_is_taken_by_name_and_null_is_not():
    from rlft.cli import check_arguments
    from rlft.config import GROUPS
    from rlft.config.describe import group_options
    for group in GROUPS:
        for option in group_options(group):  # an option may be called none (env=none)
            check_arguments([f"{group}={option}"])
        if "null" not in group_options(group):
            with pytest.raises(ConfigError, match=f"{group}= takes the name of one of its options"):
                check_arguments([f"{group}=null"])


def test_a_malformed_omp_num_threads_is_one_line_before_torch_loads():
    proc = subprocess.run([sys.executable, "-m", "rlft.cli", "train"], cwd=ROOT, capture_output=True, text=True,
                          env=os.environ | {"OMP_NUM_THREADS": "two"}, timeout=120)
    assert proc.returncode == 2  # not libgomp's "Invalid value for environment variable OMP_NUM_THREADS" first
    assert proc.stderr == ("rlft: error: the OMP_NUM_THREADS environment variable must be a whole number >= 1 "
                           "(got 'two')\n")


def test_a_dataset_folder_with_a_readme_and_no_data_is_one_line(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "README.md").write_text("my rows\n")  # no dataset card: the hub client said so on stderr
    proc = rlft_proc("train", f"hydra.run.dir={tmp_path / 'run'}", "data=dataset", f"data.path={tmp_path / 'rows'}")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("rlft: error: data.path '") and "doesn't contain any data files" in err


def test_joining_an_address_where_something_else_answers_is_one_line_at_once():
    """Ray's client retries a port where something else answers for minutes (the dashboard's 8265 is a
    usual slip); an answer that is not HTTP/2 (gRPC, what Ray's GCS speaks) is refused at once, in one line."""
    import socketserver
    import threading

    class NotRay(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.sendall(b"HTTP/1.1 404 Not Found\r\n\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), NotRay)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{server.server_address[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(ConfigError, match=rf"hardware.ray_address={address}: not a Ray cluster \(it answered "
                                              r"'HTTP/1.1 404 Not Found'; Ray's GCS speaks gRPC, on port 6379"):
            join_ray(address, timeout_s=5)
    finally:
        server.shutdown()
    assert time.monotonic() - started < 10
