"""Collapse detection (rlft.tooling.collapse, trainer.stop_on_collapse): the rule by hand, its state rebuilt
from the logged rows, and on real runs: it fires on a run made to collapse and stays quiet on the default run."""

import math

import pytest
from conftest import read_metrics

from rlft.tooling.collapse import CollapseWatch


def readings(rewards, window=3, drop=0.5):
    watch = CollapseWatch(window, drop)
    return [watch.observe(r) for r in rewards]


def test_the_rule_fires_once_the_moving_mean_falls_the_drop_below_its_best():
    out = readings([0.2, 0.4, 0.6, 0.6, 0.6, 0.1, 0.0, 0.0])
    assert [math.isnan(r.window_mean) for r in out[:2]] == [True, True] and out[1].drop == 0.0
    means = [0.4, 1.6 / 3, 0.6, 1.3 / 3, 0.7 / 3, 0.1 / 3]
    assert [r.window_mean for r in out[2:]] == pytest.approx(means)
    assert [r.best_window for r in out[2:]] == pytest.approx([0.4, 1.6 / 3, 0.6, 0.6, 0.6, 0.6])
    assert [r.drop for r in out[2:]] == pytest.approx([0, 0, 0, 1 - 1.3 / 1.8, 1 - 0.7 / 1.8, 1 - 0.1 / 1.8])
    assert [r.fired for r in out] == [False] * 6 + [True, True]
    assert [r.onset for r in out] == [False] * 6 + [True, False]  # a warning at the onset, not every step
    # a recovery clears it; a second fall is a new onset
    again = readings([0.6, 0.6, 0.6, 0.0, 0.0, 0.6, 0.6, 0.6, 0.0, 0.0, 0.0])
    assert [r.onset for r in again].count(True) == 2


def test_a_run_that_never_learned_has_nothing_to_lose_and_a_steady_one_never_fires():
    assert not any(r.fired for r in readings([0.04, 0.0, 0.03, 0.0, 0.0, 0.0, 0.0]))
    steady = readings([0.3, 0.5, 0.4, 0.6, 0.45, 0.55, 0.35, 0.5, 0.4], drop=0.5)
    assert not any(r.fired for r in steady) and max(r.drop for r in steady) < 0.5


def test_a_step_without_a_reward_leaves_the_state_alone_and_logs_no_nan():
    watch = CollapseWatch(2, 0.5)
    watch.observe(0.6)
    for bad in (float("nan"), float("inf")):
        skipped = watch.observe(bad)
        assert skipped.row() == {"collapse/reward_drop": 0.0, "collapse/fired": 0}
    assert watch.observe(0.6).window_mean == pytest.approx(0.6)  # the NaN never entered the window
    assert set(readings([0.1])[0].row()) == {"collapse/task_reward", "collapse/reward_drop", "collapse/fired"}


def test_the_early_warning_reads_the_first_five_updates_mean_old_new_kl():
    from rlft.tooling.collapse import early_kl_warning
    assert early_kl_warning([0.3, 0.25, 0.2, 0.15, 0.15]) is not None  # mean 0.21
    assert "averages 0.210" in early_kl_warning([0.3, 0.25, 0.2, 0.15, 0.15])
    assert early_kl_warning([0.2] * 5) is None and early_kl_warning([0.5] * 4) is None
    assert early_kl_warning([float("nan")] * 5) is None


def test_the_state_is_rebuilt_from_the_logged_rows():
    rewards = [0.2, 0.5, 0.7, 0.7, 0.3, 0.1]
    straight = CollapseWatch(3, 0.4)
    rows = [{"step": i + 1} | straight.observe(r).row() for i, r in enumerate(rewards[:4])]
    rows.insert(2, {"step": 2, "kind": "eval", "eval/accuracy": 0.5})  # eval rows are skipped
    resumed = CollapseWatch(3, 0.4)
    resumed.replay(rows)
    assert [resumed.observe(r) for r in rewards[4:]] == [straight.observe(r) for r in rewards[4:]]


def test_the_early_warning_is_given_once_and_a_resumed_run_gives_it_where_a_straight_one_does():
    kls = [0.4, 0.3, 0.2, 0.25, 0.1, 0.9, 0.9]  # the first five average 0.25
    straight = CollapseWatch(3, 0.5)
    warnings = [straight.observe_update(kl) for kl in kls]
    assert [w is not None for w in warnings] == [False, False, False, False, True, False, False]
    rows = [{"step": i + 1, "train/approx_kl": kl} for i, kl in enumerate(kls)]
    rows.insert(1, {"step": 1, "kind": "eval", "train/approx_kl": 5.0})  # not an update: skipped
    for stopped_after in (3, 5):  # resumed before the fifth update, and after it
        resumed = CollapseWatch(3, 0.5)
        resumed.replay(rows[:stopped_after + 1])
        assert [resumed.observe_update(kl) is not None for kl in kls[stopped_after:]] == \
            [w is not None for w in warnings[stopped_after:]]


COLLAPSING = ["model=tiny_moe", "algo.kl_coef=0", "trainer.steps=40", "trainer.prompts_per_step=32",
              "algo.ppo_epochs=8", "compute.micro_batch_size=64", "optim.lr=1e-3", "trainer.eval_every=100",
              "trainer.save_every=5", "logger.console=true"]


@pytest.mark.slow
def test_the_rule_stops_a_run_made_to_collapse_and_keeps_its_last_checkpoint(rlft, tmp_path):
    """GRPO without a KL term, 8 epochs at lr 1e-3 on the MoE model: the held-out accuracy rises, then the
    task reward falls to near zero. The rule fires on the way down, the run stops there with one warning, and
    the checkpoint from before the collapse is the one kept; no final model is written."""
    run = tmp_path / "run"
    proc = rlft("train", f"hydra.run.dir={run}", *COLLAPSING, "trainer.stop_on_collapse=true")
    rows = read_metrics(run)
    steps = [r for r in rows if r.get("kind") != "eval"]
    fired = [r["step"] for r in steps if r["collapse/fired"]]
    assert fired == [steps[-1]["step"]] and fired[0] < 40  # stopped at the first firing
    last = steps[-1]
    assert last["collapse/reward_drop"] >= 0.5 and last["collapse/reward_window"] < 0.5 * last["collapse/reward_best_window"]
    assert [r["step"] for r in rows if r.get("kind") == "eval"][-1] == fired[0]  # the collapsed policy, evaluated
    assert proc.stderr.count("collapse:") == 1 and "stopping (trainer.stop_on_collapse=true)" in proc.stderr
    early = [r["train/approx_kl"] for r in steps[:5]]
    assert sum(early) / 5 > 0.2 and "step 5: the old-new KL (train/approx_kl) of the first 5 updates" in proc.stderr
    kept = sorted(int(p.name.split("_")[-1]) for p in (run / "checkpoints").glob("step_*"))
    assert kept and kept[-1] < fired[0] and not (run / "final_model").exists()
    assert f"stopped at step {fired[0]}: collapse" in proc.stdout


@pytest.mark.slow
def test_without_stop_the_rule_warns_once_and_the_run_goes_on(rlft, tmp_path):
    run = tmp_path / "run"
    proc = rlft("train", f"hydra.run.dir={run}", *COLLAPSING, "trainer.steps=16")
    steps = [r for r in read_metrics(run) if r.get("kind") != "eval"]
    assert len(steps) == 16 and sum(r["collapse/fired"] for r in steps) >= 1
    onsets = sum(1 for a, b in zip(steps, steps[1:]) if b["collapse/fired"] and not a["collapse/fired"]) + \
        steps[0]["collapse/fired"]
    assert proc.stderr.count("collapse:") == onsets and "going on" in proc.stderr
    assert (run / "final_model").exists()
