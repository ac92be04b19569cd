"""Every `rlft train` command in the README and in the usage text composes and passes the config's checks
(`--cfg job`); the README's error examples fail with the line they show, before anything is written. What
the other commands point at (a hub model, your data file) is not looked up: that is preflight's job,
tested elsewhere."""

import re
import shlex

import pytest

from conftest import ROOT
from rlft.cli import USAGE

PLACEHOLDER = re.compile(r"\b(KEY|VALUE|GROUP|OPTION|DIR|RUN_DIR|PNG|N)\b|\.\.\.")


def commands(text: str) -> list[tuple[str, str | None]]:
    """(command, the error line shown after it or None) for each `rlft train` line of a text's code."""
    lines = text.splitlines()
    found = []
    for index, line in enumerate(lines):
        code = line.strip().removeprefix("$ ")
        while code.endswith("\\") and index + 1 < len(lines):  # continued on the next line
            index += 1
            code = code[:-1].rstrip() + " " + lines[index].strip()
        code = re.sub(r"^(\w+=\S+ )+", "", code)  # WANDB_MODE=offline rlft train ...
        if not code.startswith("rlft train"):
            continue
        code = re.split(r"\s{2,}|\s+#", code)[0].strip()  # a comment, or the usage text's description
        following = lines[index + 1].strip() if index + 1 < len(lines) else ""
        found.append((code, following.removeprefix("rlft: error: ") if following.startswith("rlft: error:") else None))
    return found


def one_run_of(args: list[str]) -> list[str]:
    """A sweep's first run: `-m` dropped, each swept key at its first value."""
    if "-m" not in args:
        return args
    out = []
    for arg in args:
        if arg == "-m":
            continue
        key, _, value = arg.partition("=")
        if "," in value and not value.startswith(("[", "{", "'")):
            value = value.split(",")[0]
        out.append(f"{key}={value}" if value else arg)
    return out


README = commands((ROOT / "README.md").read_text())
USAGE_COMMANDS = commands(USAGE)


def test_the_readme_and_the_usage_have_commands():
    assert len(README) > 25 and len(USAGE_COMMANDS) >= 5
    assert any(error for _, error in README)


@pytest.mark.parametrize("command,error", README + USAGE_COMMANDS, ids=[c for c, _ in README + USAGE_COMMANDS])
def test_a_documented_command_composes(rlft_here, tmp_path, command, error):
    """In this process: a fresh interpreter per command cost minutes of CI."""
    if PLACEHOLDER.search(command) or "resume=" in command:
        pytest.skip("a template (or a resume of a run that is not here)")
    args = one_run_of(shlex.split(command)[2:])
    if "--help" in args:
        assert rlft_here("train", *args).stdout.strip()
        return
    if error is not None:  # an error example: the run itself stops with that line (some are preflight's)
        proc = rlft_here("train", *args, f"hydra.run.dir={tmp_path / 'run'}", check=False)
        assert proc.returncode == 2 and error.split("...")[0] in proc.stderr, proc.stderr
        assert not (tmp_path / "run").exists()
        return
    proc = rlft_here("train", *args, *([] if "--cfg" in args else ["--cfg", "job"]), check=False)
    assert proc.returncode == 0, f"{command}\n{proc.stderr}"
    assert proc.stdout.startswith("# options: ")


def test_the_readme_reasoning_gym_commands_load_their_tasks():
    """Composing is not enough for data.tasks: its generator options are checked where the task loads."""
    from rlft.config.compose import compose, to_run_config
    from rlft.data import load_task
    documented = [c for c, error in README if "data=reasoning_gym" in c and error is None]
    assert any("weight:" in c for c in documented)
    for command in documented:
        cfg = to_run_config(*compose([*shlex.split(command)[2:], "data.size=20", "data.eval_size=4"]))
        train, held_out = load_task(cfg.data)
        assert len(train) >= 20 and len(held_out) >= 4
