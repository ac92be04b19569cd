import pytest

from rlft.algos.settings import eps_high_at, lr_at
from rlft.config.algo import AlgoConfig, EpsHighSchedule
from rlft.config.compose import compose, to_run_config
from rlft.config.run import TrainerConfig
from rlft.preflight import Prepared, describe_run, steps_for


def test_lr_warms_up_linearly_then_stays():
    assert [lr_at(s, 1e-4, 4) for s in (1, 2, 4, 9)] == pytest.approx([2.5e-5, 5e-5, 1e-4, 1e-4])
    assert lr_at(1, 1e-4, 0) == 1e-4


def test_eps_high_is_constant_or_follows_its_schedule():
    assert eps_high_at(50, AlgoConfig(eps_high=0.2)) == 0.2
    linear = AlgoConfig(eps_high=0.2, eps_high_schedule=EpsHighSchedule(kind="linear", end=0.3, steps=10))
    assert [eps_high_at(s, linear) for s in (0, 5, 10, 20)] == pytest.approx([0.2, 0.25, 0.3, 0.3])
    cosine = AlgoConfig(eps_high=0.2, eps_high_schedule=EpsHighSchedule(kind="cosine", end=0.3, steps=10))
    assert eps_high_at(5, cosine) == pytest.approx(0.25) and eps_high_at(2, cosine) < 0.22


def test_batch_description_uses_the_one_vocabulary():
    dcfg, choices = compose(["trainer.prompts_per_step=16", "algo.group_size=4", "algo.ppo_epochs=2",
                             "compute.micro_batch_size=24"])
    cfg = to_run_config(dcfg, choices)

    class Encode:
        chat = False
    prepared = Prepared("path", None, Encode(), train=[None] * 800, held_out=[None] * 50, scorer=None, steps=100)
    text = describe_run(cfg, prepared, start_step=0)
    assert "16 prompts/step x group_size 4 = 64 responses/step (<= 512 response tokens)" in text
    assert "micro_batch_size 24 -> 3 forward/backward per optimizer step" in text
    assert "ppo_epochs 2 -> 2 optimizer step(s)/step, 200 in all" in text


def test_epochs_set_the_number_of_steps_rounded_up():
    assert steps_for(TrainerConfig(steps=7), train_size=100) == 7
    assert steps_for(TrainerConfig(steps=7, epochs=1.5, prompts_per_step=8), train_size=100) == 19  # 18.75
    assert steps_for(TrainerConfig(epochs=2, prompts_per_step=10), train_size=100) == 20
