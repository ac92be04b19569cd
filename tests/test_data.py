import random

import pytest

from rlft.data import load_task
from rlft.data.arithmetic import sloppy_sum, split_problems
from rlft.data.jsonl import load_jsonl
from rlft.data.sampler import PromptSampler
from rlft.config import DataConfig
from rlft.errors import ConfigError


def test_split_is_deterministic_disjoint_and_complete():
    train, held_out = split_problems(10, 99, 500, split_seed=0)
    again_train, again_held = split_problems(10, 99, 500, split_seed=0)
    assert (train, held_out) == (again_train, again_held)
    assert len(held_out) == 500 and len(train) + len(held_out) == 90 * 90
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert split_problems(10, 99, 500, split_seed=1)[1] != held_out
    assert all(int(p.answer) == sum(map(int, p.prompt[:-1].split("+"))) for p in held_out)


def test_sloppy_teacher_is_exact_without_forgetting_and_drops_carries_when_it_forgets():
    rng = random.Random(0)
    assert all(sloppy_sum(a, b, 0.0, rng) == str(a + b) for a in range(0, 120, 7) for b in range(0, 120, 3))
    assert sloppy_sum(57, 65, 1.0, rng) == "12"   # 7+5=12 -> 2, carry lost; 5+6=11 -> 1, carry lost
    assert sloppy_sum(12, 34, 1.0, rng) == "46"   # no carry, nothing to forget


def test_sampler_resumes_exactly_from_its_position():
    problems, _ = split_problems(10, 20, 21, split_seed=0)  # 100 problems
    straight = PromptSampler(problems, seed=3)
    first = straight.next(300)  # crosses epochs
    resumed = PromptSampler(problems, seed=3, position=137)
    assert resumed.next(163) == first[137:]
    epoch = first[:len(problems)]
    assert sorted(p.prompt for p in epoch) == sorted(p.prompt for p in problems)  # an epoch is a permutation


def test_jsonl_loader_and_its_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"q": "1+1=", "a": "2"}\n\n{"q": "2+2=", "a": 4}\n')
    rows = load_jsonl(str(good), prompt_key="q", answer_key="a")
    assert [(r.prompt, r.answer) for r in rows] == [("1+1=", "2"), ("2+2=", "4")]
    cases = {
        '{"prompt": "x", "answer": "y"}\n{"prompt": "x"\n': r"bad\.jsonl:2: not valid JSON",
        '{"prompt": "x"}\n': r"bad\.jsonl:1: missing key 'answer'",
        '{"prompt": "  ", "answer": "1"}\n': r"bad\.jsonl:1: empty prompt",
        '[1, 2]\n': r"bad\.jsonl:1: expected a JSON object",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_jsonl(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_jsonl(str(tmp_path / "missing.jsonl"))


def test_jsonl_task_splits_off_held_out_rows(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(30)))
    train, held_out = load_task(DataConfig(name="jsonl", path=str(data), eval_size=10))
    assert len(train) == 20 and len(held_out) == 10
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
