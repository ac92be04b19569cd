"""The perf/ work model: FLOP and byte counts against hand counts, the peak fractions against a fake peaks
file, the step row's keys with and without peaks, and scripts/measure_peaks.py's cache."""

import importlib.util
import json

import pytest
import torch

from conftest import ROOT
from rlft.models.loading import empty_causal_lm, resolve_model_path
from rlft.tooling.flops import PHASES, PhaseWork, Roof, model_shape, rollout_tokens, step_work
from rlft.tooling.metrics import Stopwatch, step_row
from rlft.tooling.peaks import load_peaks, run_roofs
from rlft.types import LossSettings, Problem, Rollout, ScoredGroups, Scores, SyncStats, UpdateStats

# tiny-adder (config.json): 4 layers, hidden 128, 4 query heads and 2 key-value heads of 32, MLP 512, vocab 22,
# tied embeddings. Per layer: q 128x128, k and v 64x128, o 128x128, gate/up/down 3 x 512x128.
LAYER = 128 * 128 + 2 * 64 * 128 + 128 * 128 + 3 * 512 * 128         # 245,760
BODY = 4 * LAYER                                                        # 983,040
HEAD = 22 * 128                                                         # the embedding table, tied
# every weight once: the matrices, q/k/v biases (128 + 64 + 64) and 2 norms (128 each) per layer, the final
# norm, the table
WEIGHTS = BODY + 4 * (256 + 256) + 128 + HEAD                           # 988,032


@pytest.fixture(scope="module")
def tiny():
    return model_shape(empty_causal_lm(resolve_model_path("builtin:tiny-adder")), dtype_bytes=4)


def hand_rollout() -> Rollout:
    """2 groups of 2: prompts of 3 and 2 tokens (left-padded to 3), responses of 2, 1 and 3, 2 tokens."""
    prompt_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    return Rollout(prompt_ids=prompt_mask * 5, prompt_mask=prompt_mask, response_ids=response_mask * 7,
                   response_mask=response_mask, logprobs=-response_mask.float(),
                   truncated=torch.tensor([False, False, True, False]))


def test_the_tiny_model_shape_is_its_hand_count(tiny):
    assert tiny.body_params == BODY and tiny.head_params == HEAD
    assert tiny.layers == 4 and tiny.attention_width == 4 * 32
    assert tiny.weight_bytes == 4 * WEIGHTS


def test_experts_count_at_the_share_a_token_is_routed_through():
    moe = model_shape(empty_causal_lm(resolve_model_path("builtin:tiny-moe")), dtype_bytes=4)
    attention = 128 * 128 + 2 * 64 * 128 + 128 * 128
    experts = 8 * (2 * 128 * 128 + 128 * 128)  # 8 experts of gate/up/down 128 x 128 (moe_intermediate_size)
    router = 8 * 128
    assert moe.body_params == 4 * (attention + experts * 2 / 8 + router)  # top 2 of 8
    assert moe.weight_bytes > 4 * 4 * experts  # a decode step reads every expert


def test_rollout_tokens_count_each_prompt_once_and_causal_keys():
    tokens = rollout_tokens(hand_rollout(), groups=2)
    # fed: the prompts (3 + 2) and each response but its last token (1 + 0 + 2 + 1)
    assert tokens.fed == 9
    assert tokens.scored == 8 and tokens.decode_steps == 3
    # position i sees i + 1 keys. Prompt 1: 1 + 2 + 3; row 1's fed token at 3: 4; row 2: none.
    # Prompt 2: 1 + 2; row 3's at 2 and 3: 3 + 4; row 4's at 2: 3.
    assert tokens.attended == 6 + 4 + 3 + 7 + 3


def test_step_work_is_2n_forward_4n_backward(tiny):
    tokens = rollout_tokens(hand_rollout(), groups=2)
    weights = 2 * BODY * 9 + 2 * HEAD * 8   # 2N per fed token, the head at each scored one
    attention = 4 * 4 * 128 * 23            # 4 x layers x width per attended key
    work = step_work(tiny, tokens, ppo_epochs=2, reference=True)
    assert work["generate"] == PhaseWork(weights + attention, 3 * 4 * WEIGHTS)  # each decode step reads all
    assert work["reference"] == PhaseWork(weights + attention, 4 * WEIGHTS)
    assert work["forward"] == PhaseWork(2 * (weights + attention), 2 * 4 * WEIGHTS)
    assert work["backward"] == PhaseWork(2 * (2 * weights + 2 * attention), 2 * 2 * 4 * WEIGHTS)
    lora = step_work(tiny, tokens, ppo_epochs=1, reference=False, weight_grads=False)
    assert lora["backward"].flops == weights + 2 * attention  # activation gradients only
    assert lora["reference"] == PhaseWork(0.0, 0.0)


def write_peaks(folder, gflops=100.0, gbps=10.0):
    (folder / "peaks-cpu.json").write_text(json.dumps(
        {"device": "cpu", "name": "test", "threads": 2, "date": "2026-01-01",
         "matmul_gflops": {"float32": gflops}, "read_gbps": gbps}))


def test_a_phase_fraction_is_its_roofline_floor_over_its_seconds(tmp_path, monkeypatch):
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path))
    assert load_peaks("cpu") is None
    write_peaks(tmp_path)
    roof = load_peaks("cpu").roof("float32")
    assert roof == Roof(flops_per_s=100e9, bytes_per_s=10e9)
    assert load_peaks("cpu").roof("bfloat16") is None  # never another dtype's peak
    assert PhaseWork(flops=2e9, bytes=1e8).floor_seconds(roof) == pytest.approx(0.02)  # compute-bound
    assert PhaseWork(flops=2e9, bytes=5e8).floor_seconds(roof) == pytest.approx(0.05)  # memory-bound


def test_run_roofs_come_from_the_cache_of_the_runs_device(tmp_path, monkeypatch):
    from rlft.config.compose import compose, to_run_config

    monkeypatch.setenv("RLFT_CACHE", str(tmp_path))
    cfg = to_run_config(*compose([]))
    assert run_roofs(cfg) is None  # no peaks: no fractions, and nothing measured
    write_peaks(tmp_path)
    assert run_roofs(cfg) == {phase: Roof(100e9, 10e9) for phase in PHASES}


def step_inputs():
    rollout = hand_rollout()
    groups = ScoredGroups(problems=[Problem("1+1", "2"), Problem("2+2", "4")], rollout=rollout,
                          scores=Scores(total=torch.ones(4), correct=torch.ones(4), parts={}),
                          rewards=torch.ones(4), generate_seconds=0.5)
    stats = UpdateStats(loss=0.0, pg_loss=0.0, approx_kl=0.0, entropy=1.0, grad_norm=1.0, tokens=8,
                        logprob_diff_mean=0.0, logprob_diff_max=0.0, forward_seconds=0.2, backward_seconds=0.4,
                        optimizer_seconds=0.01)
    loss = LossSettings(ratio_level="token", eps_low=0.2, eps_high=0.2, clip_ratio_c=None, loss_agg="token_mean",
                        max_response_len=3)
    clock = Stopwatch()
    clock.seconds = {"ref": 0.1, "train": 0.61}
    return groups, stats, loss, clock


def test_step_row_has_the_work_always_and_fractions_with_peaks(tiny):
    groups, stats, loss, clock = step_inputs()
    work = step_work(tiny, rollout_tokens(groups.rollout, 2), ppo_epochs=1, reference=True)
    args = (1, groups, groups.rewards, stats, SyncStats(0.0, 0), 0.0, loss, 1e-4, clock, 100.0, work)

    without = step_row(*args, None)
    assert without["perf/forward_tflop"] == pytest.approx(work["forward"].flops / 1e12)
    assert without["perf/backward_tflop"] == pytest.approx(2 * without["perf/forward_tflop"], rel=0.01)
    assert {f"perf/{p}_tflop" for p in PHASES} <= set(without)
    assert not [key for key in without if "fraction" in key or "floor" in key]

    roof = Roof(flops_per_s=1e9, bytes_per_s=1e6)  # a slow machine: generate is memory-bound on it
    row = step_row(*args, {phase: roof for phase in PHASES})
    seconds = {"generate": 0.5, "reference": 0.1, "forward": 0.2, "backward": 0.4}
    floors = {"generate": 3 * 4 * WEIGHTS / 1e6, "reference": max(work["reference"].flops / 1e9, 4 * WEIGHTS / 1e6),
              "forward": max(work["forward"].flops / 1e9, 4 * WEIGHTS / 1e6),
              "backward": max(work["backward"].flops / 1e9, 2 * 4 * WEIGHTS / 1e6)}
    for phase in PHASES:
        assert row[f"perf/{phase}_peak_fraction"] == pytest.approx(floors[phase] / seconds[phase])
    assert row["perf/step_floor_seconds"] == pytest.approx(sum(floors.values()))
    assert row["perf/step_floor_fraction"] == pytest.approx(sum(floors.values()) / row["perf/step_seconds"])


def test_measure_peaks_caches_what_print_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RLFT_CACHE", str(tmp_path))
    spec = importlib.util.spec_from_file_location("measure_peaks", ROOT / "scripts/measure_peaks.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    threads = torch.get_num_threads()
    try:
        script.main(["--size", "tiny", "--repeats", "1"])
    finally:
        torch.set_num_threads(threads)  # it sets the trainer's thread count
    measured = capsys.readouterr().out
    cached = json.loads((tmp_path / "peaks-cpu.json").read_text())
    assert cached["matmul_gflops"]["float32"] > 0 and cached["read_gbps"] > 0 and cached["threads"] >= 1
    assert load_peaks("cpu").matmul_gflops == cached["matmul_gflops"]
    script.main(["--print"])
    assert capsys.readouterr().out.strip() in measured  # the same table, from the cache
    with pytest.raises(SystemExit, match="no peaks cached for cuda"):
        script.main(["--print", "--device", "cuda"])
