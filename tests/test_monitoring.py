"""W&B logging (offline), multirun groups and tags, and `rlft compare`'s figure and table."""

import math

import pytest
from conftest import TINY_RUN, read_metrics
from omegaconf import OmegaConf
from wandb_records import read_offline_run

from rlft.cli import swept_keys
from rlft.tooling.compare import plot_comparison
from rlft.tooling.metrics import PANELS

SHORT = ["trainer.steps=3", "trainer.eval_every=2", *TINY_RUN]


def scalars(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "kind" and not isinstance(v, (list, dict))}


def test_offline_wandb_run_holds_the_config_and_every_metric(rlft, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: the run is written under the run dir
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", "logger=wandb", "algo=dapo", "logger.tags=[mine]",
         "logger.log_model=true", *SHORT)
    logged = read_offline_run(run)
    saved = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    assert {k: logged["config"][k] for k in saved} == saved
    assert logged["config"]["options"]["algo"] == "dapo"  # the group options, for the run table
    assert logged["run"].display_name == "run" and list(logged["run"].tags) == ["mine"]

    rows = read_metrics(run)
    history = [{k: v for k, v in h.items() if not k.startswith("_") and not k.startswith("eval/samples")}
               for h in logged["history"]]
    assert len(history) == len(rows)  # one W&B row per metrics.jsonl row, in order
    for ours, theirs in zip(rows, history):
        expected = {k: v for k, v in scalars(ours).items() if v is not None}
        assert theirs.keys() == expected.keys()
        for key, value in expected.items():
            assert math.isclose(theirs[key], value, rel_tol=1e-12, abs_tol=1e-15), key
    models = [a for a in logged["artifacts"] if a.type == "model"]
    assert len(models) == 1 and "model.safetensors" in {f.path for f in models[0].manifest.contents}
    evals = [h for h in logged["history"] if "eval/accuracy" in h]
    assert evals and all(h["eval/samples/_type"] == "table-file" and h["eval/samples/nrows"] == 4 for h in evals)


def test_logger_mode_disabled_writes_no_wandb_run(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", "logger=wandb", "logger.mode=disabled", "trainer.steps=1",
         "trainer.eval_every=1", *TINY_RUN)
    assert read_metrics(run) and not list(run.glob("wandb/offline-run-*"))


def test_without_log_model_no_model_artifact(rlft, tmp_path):
    run = tmp_path / "run"
    rlft("train", f"hydra.run.dir={run}", "logger=wandb", "logger.mode=offline", "trainer.steps=1",
         "trainer.eval_every=1", *TINY_RUN)
    assert not [a for a in read_offline_run(run)["artifacts"] if a.type == "model"]


def test_multirun_runs_share_a_group_and_differ_in_tags(rlft, tmp_path):
    sweep = tmp_path / "sweep"
    rlft("train", "-m", f"hydra.sweep.dir={sweep}", "logger=wandb", "logger.mode=offline", "algo=grpo,dapo",
         "seed=0", *SHORT)
    runs = sorted(p.parent for p in sweep.glob("*/metrics.jsonl"))
    assert len(runs) == 2
    logged = [read_offline_run(r)["run"] for r in runs]
    assert logged[0].run_group == logged[1].run_group == "sweep-sweep"
    assert [list(r.tags) for r in logged] == [["algo=grpo"], ["algo=dapo"]]
    assert (sweep / "comparison.png").is_file() and "| dapo | 0 |" in (sweep / "comparison.md").read_text()


def test_swept_keys_are_the_ones_with_several_values():
    assert swept_keys(["algo=grpo,dapo", "seed=range(3)", "trainer.steps=5", "+x=choice(1,2)"]) == \
        {"algo", "seed", "x"}


def test_compare_plots_one_line_per_algorithm_with_the_runs_values(rlft, tmp_path):
    runs = []
    for algo, seed in [("grpo", 0), ("grpo", 1), ("gspo", 0)]:
        runs.append(tmp_path / f"{algo}-{seed}")
        rlft("train", f"hydra.run.dir={runs[-1]}", f"algo={algo}", f"seed={seed}", *SHORT)
    fig = plot_comparison(runs)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert list(panels) == [title for _, title, _ in PANELS]
    reward = panels["train reward"]
    assert [line.get_label() for line in reward.get_lines()] == ["grpo (2 runs)", "gspo"]
    grpo_mean = [(a["train/reward_mean"] + b["train/reward_mean"]) / 2
                 for a, b in zip(*[[r for r in read_metrics(d) if r.get("kind") != "eval"] for d in runs[:2]])]
    assert list(reward.get_lines()[0].get_ydata()) == pytest.approx(grpo_mean)
    gspo_evals = [r["eval/accuracy"] for r in read_metrics(runs[2]) if r.get("kind") == "eval"]
    assert list(panels["held-out accuracy"].get_lines()[1].get_ydata()) == pytest.approx(gspo_evals)
    assert len(reward.collections) == 1  # the band of the two grpo seeds; gspo has one run, no band

    proc = rlft("compare", *map(str, runs), "-o", str(tmp_path / "cmp.png"))
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    assert proc.stdout.count("| grpo |") == 3 and "| gspo | 0 |" in proc.stdout  # 2 runs + the mean row


def test_compare_without_runs_is_one_error(rlft, tmp_path):
    proc = rlft("compare", str(tmp_path), check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("rlft: error: no run directories")


def test_runs_of_two_experiment_presets_are_not_averaged_together():
    from rlft.tooling.sweep import format_table, run_label
    assert run_label({"algo": "grpo"}) == "grpo"
    assert run_label({"algo": "grpo", "experiment": "smollm2_products"}) == "grpo (smollm2_products)"
    row = {"held-out before": 0.1, "held-out after": 0.4, "first eval step >= 0.9": None,
           "train reward (last 10 steps)": 0.5, "train time (s)": 10.0, "tokens trained": 100}
    runs = [row | {"run": f"r{i}", "algo": run_label({"algo": "grpo", "experiment": name}), "seed": i}
            for i, name in enumerate(["smollm2_products", "smollm2_products", "smollm2_chain_sum"])]
    means = format_table(runs).split("\n\n")[1]
    assert "| grpo (smollm2_products) | 2 |" in means and "| grpo (smollm2_chain_sum) | 1 |" in means


def test_compare_labels_runs_named_by_overrides_by_what_differs_and_folds_seeds(tmp_path):
    from rlft.tooling.compare import run_labels
    runs = []
    for i, (algo, kl, seed) in enumerate([("grpo", 0, 0), ("grpo", 0, 1), ("grpo", 0.04, 0), ("gspo", 0, 0)]):
        run = tmp_path / f"{i}_algo={algo},algo.kl_coef={kl},trainer.steps=5,seed={seed}"
        run.mkdir()
        (run / "config.yaml").write_text(f"# options: algo={algo} model=tiny_adder\nseed: {seed}\n")
        runs.append(run)
    assert run_labels(runs) == ["grpo algo.kl_coef=0", "grpo algo.kl_coef=0", "grpo algo.kl_coef=0.04",
                                "gspo algo.kl_coef=0"]
    # a name's own algo (a variant composed from a preset, like GSPO-token from algo=gspo) keeps its line
    variant = tmp_path / "algo=gspo_token,algo.kl_coef=0,trainer.steps=5,seed=0"
    variant.mkdir()
    (variant / "config.yaml").write_text("# options: algo=gspo model=tiny_adder\nseed: 0\n")
    assert run_labels([runs[3], variant]) == ["gspo", "gspo_token"]
