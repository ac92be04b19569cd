"""A real pretrained model end to end: SmolLM2-135M-Instruct from `make smollm2`, two RL steps.

Opt-in (a 500 MB conversion, minutes of CPU): RLFT_TEST_SMOLLM2=1 pytest -m slow tests/test_smollm2.py,
or `make test-smollm2`, which fetches the model first."""

import os

import pytest
import torch
from safetensors.torch import load_file

from conftest import read_metrics
from rlft.models.loading import resolve_model_path

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("RLFT_TEST_SMOLLM2") != "1", reason="opt-in: RLFT_TEST_SMOLLM2=1")]

FOLDER = os.path.expanduser(f"{os.environ.get('RLFT_CACHE', '~/.cache/rlft')}/models/smollm2-135m-instruct")


def test_two_rl_steps_on_smollm2_with_its_chat_template(rlft, tmp_path):
    if not os.path.isdir(FOLDER):
        pytest.fail(f"{FOLDER} is missing: run `make smollm2` first")
    run = tmp_path / "run"
    proc = rlft("train", f"hydra.run.dir={run}", "model=smollm2_135m", "data.eval_size=8",
                "data.system_prompt='Reply with only the final number.'", "reward.fns=[answer_match,length_penalty]",
                "reward.length_target=3", "reward.accuracy=answer_match", "rollout.max_new_tokens=8", "trainer.prompts_per_step=4",
                "algo.group_size=4", "trainer.steps=2", "trainer.eval_every=2", "algo.kl_coef=0.04",
                "optim.lr=1e-5", "optim.warmup_steps=0")
    assert "chat template and data.system_prompt" in proc.stdout
    rows = read_metrics(run)
    train_rows = [r for r in rows if r.get("kind") != "eval"]
    assert [r["step"] for r in train_rows] == [1, 2]
    # step 2 samples with the weights pushed after step 1: the engine and the learner still agree
    assert max(r["rollout/logprob_diff_max"] for r in train_rows) < 1e-3
    assert all(r["train/grad_norm"] > 0 for r in train_rows)  # response lengths differ: the groups have a signal
    start = load_file(f"{resolve_model_path(FOLDER)}/model.safetensors")
    final = load_file(run / "final_model" / "model.safetensors")
    assert start.keys() == final.keys()
    assert any(not torch.equal(start[k], final[k]) for k in start)
