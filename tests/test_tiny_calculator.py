"""The shipped tool-calling model rlft/models/tiny_calculator and its task, rlft/data/calculator.py."""

import random
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlft.data import calculator

MODEL = Path(__file__).resolve().parent.parent / "rlft/models/tiny_calculator"
EPISODE = "1234*567=<call>1234*567</call><eos><result>699678</result>699678<eos>"
CONVERSATION = [{"role": "user", "content": "1234*567="},
                {"role": "assistant", "content": "<call>1234*567</call>"},
                {"role": "tool", "content": "699678"},
                {"role": "assistant", "content": "699678"}]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL)


def test_special_tokens_are_one_token_each(tokenizer):
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ["<pad>", "<eos>", *calculator.TOOL_TOKENS]}
    assert ids["<pad>"] == 0 and ids["<eos>"] == 1
    assert len(set(ids.values())) == 6 and all(i >= 22 for t, i in ids.items() if t in calculator.TOOL_TOKENS)
    assert tokenizer.encode("<result>12</result>") == [ids["<result>"], tokenizer.convert_tokens_to_ids("1"),
                                                       tokenizer.convert_tokens_to_ids("2"), ids["</result>"]]
    encoded = tokenizer.encode(EPISODE)
    assert len(encoded) == 35  # 9 + (1 + 8 + 1 + 1) + (1 + 6 + 1) + (6 + 1)
    assert tokenizer.decode(encoded, skip_special_tokens=False) == EPISODE
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "1234*567=1234*567699678699678"
    # One token per character (AutoTokenizer gives transformers' Qwen2Tokenizer, whose byte-level
    # pre-tokenizer drops the space for tiny_adder too; the calculator's episodes have none).
    for char in "0123456789+-*/()=,.":
        assert tokenizer.encode(char) == [tokenizer.convert_tokens_to_ids(char)]
    assert tokenizer.encode("1234*567=") == [tokenizer.convert_tokens_to_ids(c) for c in "1234*567="]


def test_chat_template_renders_an_episode(tokenizer):
    assert tokenizer.apply_chat_template(CONVERSATION, tokenize=False) == EPISODE
    system = [{"role": "system", "content": "be brief"}]
    prompt = tokenizer.apply_chat_template(system + CONVERSATION[:1], tokenize=False, add_generation_prompt=True)
    assert prompt == "1234*567="
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    assert tokenizer.apply_chat_template(CONVERSATION, tools=tools, tokenize=False) == EPISODE
    # The chat template travels inside tokenizer_config.json (package data), not as a separate file.
    assert '"chat_template"' in (MODEL / "tokenizer_config.json").read_text()


def test_split_is_deterministic_and_disjoint():
    train, held_out = calculator.split_problems(eval_size=100, split_seed=3, size=2000)
    again_train, again_held_out = calculator.split_problems(eval_size=100, split_seed=3, size=2000)
    assert (train, held_out) == (again_train, again_held_out)
    assert len(train) == 2000 and len(held_out) == 100
    pairs = [calculator.operands(p) for p in train]
    held_pairs = [calculator.operands(p) for p in held_out]
    assert not set(pairs) & set(held_pairs) and len(set(pairs)) == len(pairs)
    for p, (a, b) in zip(train + held_out, pairs + held_pairs):
        assert 1000 <= a <= 9999 and 100 <= b <= 999
        assert p.prompt == f"{a}*{b}=" and p.answer == str(a * b)
    assert calculator.split_problems(100, 4, 2000)[1] != held_out
    # A smaller split is a prefix of a larger one, so a model SFT-trained on the larger never saw the held-out.
    small_train, small_held_out = calculator.split_problems(eval_size=50, split_seed=3, size=500)
    assert small_held_out == held_out[:50] and set(small_train) <= set(train) | set(held_out[50:])


def test_teacher_calls_with_the_problems_expression():
    rng = random.Random(0)
    calls = 0
    for _ in range(2000):
        a, b = rng.randint(1000, 9999), rng.randint(100, 999)
        messages = calculator.teacher_episode(a, b, rng)
        assert messages[0] == {"role": "user", "content": f"{a}*{b}="}
        assert [m["role"] for m in messages] in (["user", "assistant"], ["user", "assistant", "tool", "assistant"])
        final = messages[-1]["content"]
        assert final.isdigit()
        if len(messages) == 2:
            assert final != str(a * b) and len(final) == len(str(a * b)) and final[:2] == str(a * b)[:2]
            continue
        calls += 1
        assert messages[1]["content"] == f"<call>{a}*{b}</call>"
        assert calculator.parse_call(messages[1]["content"]) == f"{a}*{b}"
        assert messages[2]["content"] == str(a * b)
    assert 0.2 < calls / 2000 < 0.4


def test_calculator_tool():
    assert calculator.evaluate_expression("1234*567") == "699678"
    assert calculator.evaluate_expression("2+3*4-20") == "-6"
    for bad in ["", "12*", "-1", "1/2", "2**3", "__import__('os')", "1 + 2", "1" * 21]:
        assert calculator.evaluate_expression(bad) is None
    assert calculator.parse_call("<call>12*3</call>") == "12*3"
    assert calculator.parse_call("36") is None and calculator.parse_call("<call>1</call>2") is None


def test_shipped_model_writes_a_valid_first_turn(tokenizer):
    model = AutoModelForCausalLM.from_pretrained(MODEL).eval()
    assert model.config.max_position_embeddings >= 64
    _, held_out = calculator.split_problems(eval_size=8, split_seed=0, size=1)
    valid = re.compile(r"\d+|<call>\d+\*\d+</call>")
    for problem in held_out:
        ids = torch.tensor([tokenizer.encode(problem.prompt)])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
        new = out[0, ids.shape[1]:].tolist()
        assert new[-1] == tokenizer.eos_token_id, tokenizer.decode(new)
        turn = tokenizer.decode(new[:-1], skip_special_tokens=False)
        assert valid.fullmatch(turn), turn
