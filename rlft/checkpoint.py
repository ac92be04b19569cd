"""Checkpoints: model, optimizer, RNG states, data position and step, written atomically.

A checkpoint is written into a temporary folder and renamed into place, then `latest` is replaced
atomically, so a crash or Ctrl-C at any moment leaves the previous checkpoint whole.

It holds the full (unsharded) weights and optimizer state, so it resumes on any number of learner ranks,
sharded (FSDP) or not: the learner gathers them to rank 0 to save, and every rank reads them to load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from rlft.errors import ConfigError, NonFiniteWeights
from rlft.models.checks import safetensors_problem
from rlft.types import TrainerState


def save_checkpoint(run_dir: Path, weights: dict[str, torch.Tensor], optimizer_state: dict,
                    state: TrainerState, keep: int) -> Path:
    """`weights`: parameter name -> full tensor; `optimizer_state`: a torch optimizer state_dict()."""
    bad = first_nonfinite(weights) or first_nonfinite({k: v for k, v in optimizer_state["state"].items()})
    if bad:  # the learner skips such updates; this is the last guard before the disk
        raise NonFiniteWeights(f"step {state.step}: {bad} is not finite: the checkpoint was not written")
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{state.step:06d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _save_file({k: v.detach().contiguous() for k, v in weights.items()}, tmp / "model.safetensors")
    opt_tensors, opt_groups = _flatten_optimizer(optimizer_state)
    _save_file(opt_tensors | {"rng.rollout": state.rollout_rng, "rng.torch": state.torch_rng},
               tmp / "trainer_state.safetensors")
    meta = {"step": state.step, "sampler_position": state.sampler_position, "optimizer_param_groups": opt_groups}
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=1))
    for file in tmp.iterdir():
        _fsync(file)
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    _fsync_dir(root)  # the rename itself survives a power cut
    _atomic_write(root / "latest", name)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _save_file(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors' save_file, a failed write (a full disk, a file size limit) raised as the OSError it is
    (safetensors words it as its own error), so that the run names the file and the checkpoint to resume from."""
    try:
        save_file(tensors, path)
    except Exception as err:
        match = re.search(r"I/O error: (.*) \(os error (\d+)\)", str(err))
        if match is None:
            raise
        raise OSError(int(match[2]), match[1], str(path)) from None


FILES = ("model.safetensors", "trainer_state.safetensors", "trainer_state.json")


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest whole checkpoint; None when the run has written none. The step folders are the truth (`latest` only points at the newest
    one written): a kill between a folder's rename and the pointer's update, a pointer to a folder that is
    gone, or a damaged newest folder fall back to the newest whole one, saying so."""
    root = run_dir / "checkpoints"
    folders = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True) if root.is_dir() else []
    if not folders:  # stopped before its first checkpoint: it starts again
        return None
    problems = []
    for folder in folders:
        problem = checkpoint_problem(folder)
        if problem is None:
            for damaged, why in problems:  # warned of only when an older one resumes: else the error says it
                print(f"rlft: warning: checkpoint {damaged} is not usable ({why}); trying an older one",
                      file=sys.stderr)
            if folder != folders[0]:
                print(f"rlft: warning: resuming from {folder.name}, the newest whole checkpoint", file=sys.stderr)
            return folder
        problems.append((folder, problem))
    raise ConfigError(f"resume='{run_dir}': none of its {len(folders)} checkpoints is whole (the newest, "
                      f"{folders[0].name}: {problems[0][1]})")


def checkpoint_problem(folder: Path) -> str | None:
    """What makes a step folder unusable (a missing or truncated file, damaged metadata), or None."""
    for name in FILES:
        if not (folder / name).is_file():
            return f"no {name}"
    for name in FILES[:2]:
        problem = safetensors_problem(folder / name)
        if problem:
            return f"{name}: {problem}"
    try:
        meta = json.loads((folder / "trainer_state.json").read_text())
        if not isinstance(meta, dict) or not {"step", "sampler_position", "optimizer_param_groups"} <= set(meta):
            return "trainer_state.json lacks keys"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"trainer_state.json: {err}"
    return None


def load_checkpoint(folder: Path, param_names: list[str]) -> tuple[dict[str, torch.Tensor], dict, TrainerState]:
    """(weights, optimizer state_dict, trainer state); raises ConfigError when the weights' names are not
    `param_names` (a checkpoint of another model)."""
    weights = load_file(folder / "model.safetensors")
    if set(weights) != set(param_names):
        raise ConfigError(f"checkpoint {folder} does not match the model "
                          f"(differs in {sorted(set(weights) ^ set(param_names))[:5]})")
    tensors = load_file(folder / "trainer_state.safetensors")
    meta = json.loads((folder / "trainer_state.json").read_text())
    optimizer_state = _unflatten_optimizer(tensors, meta["optimizer_param_groups"])
    return weights, optimizer_state, TrainerState(step=meta["step"], sampler_position=meta["sampler_position"],
                                                  rollout_rng=tensors["rng.rollout"], torch_rng=tensors["rng.torch"])


def _flatten_optimizer(sd: dict) -> tuple[dict[str, torch.Tensor], list[dict]]:
    tensors = {f"optim.{index}.{key}": value.contiguous() for index, slots in sd["state"].items()
               for key, value in slots.items()}
    return tensors, sd["param_groups"]


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], param_groups: list[dict]) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for group in param_groups:  # JSON turned tuples into lists
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": param_groups}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    _fsync(tmp)
    os.replace(tmp, path)


def first_nonfinite(tensors: dict) -> str | None:
    """The name of the first floating tensor (nested dicts searched) holding NaN or an infinity."""
    for name, value in tensors.items():
        if isinstance(value, dict):
            inner = first_nonfinite(value)
            if inner:
                return f"{name}.{inner}"
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return str(name)
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
