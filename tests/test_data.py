import json
import random

import pytest

from rlft.data import load_task
from rlft.data.arithmetic import sloppy_sum, split_problems
from rlft.data.files import load_problems
from rlft.data.sampler import PromptSampler
from rlft.config import data as schemas
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
    assert epoch != problems and first[len(problems):2 * len(problems)] != epoch  # a new order each epoch
    in_order = PromptSampler(problems, seed=3, shuffle=False).next(250)
    assert in_order == problems + problems + problems[:50]


def test_jsonl_loader_and_its_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"q": "1+1=", "a": 2, "level": 1}\n\n{"q": "2+2=", "a": "4"}\n')
    rows = load_problems(str(good), "train", prompt_key="q", answer_key="a", map_fn=None)
    assert [(r.prompt, r.answer) for r in rows] == [("1+1=", "2"), ("2+2=", "4")]
    assert rows[0].fields == {"level": 1}  # the other fields go to the reward functions
    for text, message in {
        '{"prompt": "x", "answer": "y"}\n{"prompt": "x"\n': r"bad\.jsonl:2: not valid JSON",
        '{"prompt": "x"}\n': r"bad\.jsonl:1: missing key 'answer' \(keys: prompt\)",
        '{"prompt": "  ", "answer": "1"}\n': r"bad\.jsonl:1: empty prompt",
        '[1, 2]\n': r"bad\.jsonl:1: expected a JSON object",
        '': r"has no rows",
    }.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_problems(str(bad), "train", "prompt", "answer", None)
    with pytest.raises(ConfigError, match="does not exist"):
        load_problems(str(tmp_path / "missing.jsonl"), "train", "prompt", "answer", None)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="unknown format"):
        load_problems(str(tmp_path / "notes.txt"), "train", "prompt", "answer", None)


def test_csv_and_parquet_rows_with_their_errors(tmp_path):
    import pyarrow
    import pyarrow.parquet
    (tmp_path / "d.csv").write_text("prompt,answer,topic\n1+1=,2,add\n3*3=,9,mul\n")
    rows = load_problems(str(tmp_path / "d.csv"), "train", "prompt", "answer", None)
    assert [(r.prompt, r.answer, r.fields["topic"]) for r in rows] == [("1+1=", "2", "add"), ("3*3=", "9", "mul")]
    (tmp_path / "bad.csv").write_text("prompt,answer\n1+1=,2\n2+2=,4,extra\n")
    with pytest.raises(ConfigError, match=r"bad\.csv:3: 3 cells, but the header has 2 columns"):
        load_problems(str(tmp_path / "bad.csv"), "train", "prompt", "answer", None)
    table = pyarrow.table({"question": ["a?", "b?"], "solution": ["1", "2"]})
    pyarrow.parquet.write_table(table, tmp_path / "d.parquet")
    rows = load_problems(str(tmp_path / "d.parquet"), "train", "question", "solution", None)
    assert [(r.prompt, r.answer) for r in rows] == [("a?", "1"), ("b?", "2")]
    with pytest.raises(ConfigError, match=r"d\.parquet row 0: missing key 'prompt' \(keys: question, solution\)"):
        load_problems(str(tmp_path / "d.parquet"), "train", "prompt", "answer", None)
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        load_problems(str(tmp_path / "broken.parquet"), "train", "prompt", "answer", None)


def test_dataset_folders_go_through_hugging_face_datasets_like_a_hub_id(tmp_path):
    """A folder of data files and a save_to_disk folder: the `datasets` code path a hub id takes."""
    import datasets
    files = tmp_path / "files"
    files.mkdir()
    (files / "train.jsonl").write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(5)))
    (files / "test.jsonl").write_text('{"prompt": "9+1=", "answer": "10"}\n')
    cfg = schemas.DatasetData(path=str(files), eval_split="test")
    train, held_out = load_task(cfg)
    assert len(train) == 5 and [(p.prompt, p.answer) for p in held_out] == [("9+1=", "10")]
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"prompt": ["a", "b", "c"], "answer": ["1", "2", "3"]})}
                         ).save_to_disk(str(saved))
    train, held_out = load_task(schemas.DatasetData(path=str(saved), eval_size=1))
    assert len(train) == 2 and len(held_out) == 1
    with pytest.raises(ConfigError, match=r"data.path '.*files' \(split 'validation'\): cannot load it as a dataset"):
        load_task(schemas.DatasetData(path=str(files), split="validation"))


def test_a_mapping_function_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_data.py").write_text(
        "def to_problem(row):\n"
        "    if row['n'] == 3:\n        raise ValueError('three is bad')\n"
        "    return {'prompt': f\"What is {row['n']} squared?\", 'answer': row['n'] ** 2, 'n': row['n']}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "d.jsonl").write_text('{"n": 2}\n{"n": 4}\n')
    rows = load_problems(str(tmp_path / "d.jsonl"), "train", "prompt", "answer", "my_data:to_problem")
    assert [(r.prompt, r.answer, r.fields) for r in rows] == [("What is 2 squared?", "4", {"n": 2}),
                                                             ("What is 4 squared?", "16", {"n": 4})]
    (tmp_path / "e.jsonl").write_text('{"n": 2}\n{"n": 3}\n')
    with pytest.raises(ConfigError, match=r"e\.jsonl:2: data.map_fn 'my_data:to_problem' raised ValueError: three"):
        load_problems(str(tmp_path / "e.jsonl"), "train", "prompt", "answer", "my_data:to_problem")
    with pytest.raises(ConfigError, match="data.map_fn 'my_data:nope': module 'my_data' has no function 'nope'"):
        load_problems(str(tmp_path / "d.jsonl"), "train", "prompt", "answer", "my_data:nope")


def test_dataset_task_splits_off_held_out_rows(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(30)))
    train, held_out = load_task(schemas.DatasetData(path=str(data), eval_size=10))
    assert len(train) == 20 and len(held_out) == 10
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}


@pytest.mark.parametrize("name,reward", [("countdown", "countdown"), ("multistep", "answer_match")])
def test_generated_tasks_are_solvable_deterministic_and_disjoint(name, reward):
    from rlft.rewards import call_reward, resolve_reward
    cfg = {"countdown": schemas.CountdownData, "multistep": schemas.MultistepData}[name](size=300, eval_size=50,
                                                                                    max_operand=20)
    train, held_out = load_task(cfg)
    assert (len(train), len(held_out)) == (300, 50)
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert [p.prompt for p in load_task(cfg)[1]] == [p.prompt for p in held_out]
    fn = resolve_reward(reward)
    for p in train[:100]:  # the reference answer, in the asked-for format, scores full marks
        completion = f"<think>...</think><answer>{p.answer}</answer>"
        assert call_reward(fn, {"completion": completion, "answer": p.answer, **p.fields}) == 1.0


def test_reasoning_gym_mix_and_its_scorer():
    from rlft.rewards.builtin import reasoning_gym_score
    train, held_out = load_task(schemas.ReasoningGymData(tasks={"chain_sum": 1.0, "countdown": 1.0},
                                           size=20, eval_size=6))
    assert {p.fields["rg_task"] for p in train} == {"chain_sum", "countdown"} and len(train) == 20
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    for problem in train:
        right = f"<answer>{problem.answer}</answer>"
        assert reasoning_gym_score(right, problem.fields["rg_task"], problem.fields["rg_entry"]) == 1.0
        assert reasoning_gym_score("<answer>12345678</answer>", problem.fields["rg_task"],
                                   problem.fields["rg_entry"]) < 1.0
    with pytest.raises(ConfigError, match="reasoning-gym has no task 'no_such_task'"):
        load_task(schemas.ReasoningGymData(tasks={"no_such_task": 1.0}, size=2, eval_size=1))


def test_reasoning_gym_generator_options_shape_the_problems_and_are_checked():
    tasks = {"chain_sum": {"weight": 1, "min_terms": 3, "max_terms": 3, "max_digits": 1}}
    train, held_out = load_task(schemas.ReasoningGymData(tasks=tasks, size=300, eval_size=50, split_seed=3))
    assert len(train) == 300 and len(held_out) == 50
    for problem in train + held_out:
        metadata = problem.fields["rg_entry"]["metadata"]
        assert metadata["num_terms"] == 3 and metadata["num_digits"] == 1
    # held-out problems are distinct, and none is a training problem (checked, not left to chance)
    assert len({p.prompt for p in held_out}) == 50
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert load_task(schemas.ReasoningGymData(tasks=tasks, size=300, eval_size=50, split_seed=3))[1] == held_out
    for bad, message in [({"chain_sum": {"foo": 1}}, r"^data.tasks.chain_sum.foo: not an option of this task "
                                                     r"\(its options: weight, min_terms, max_terms"),
                         ({"chain_sum": {"min_terms": "2"}}, r"^data.tasks.chain_sum.min_terms must be int like its "
                                                             r"default 2 \(got '2'\)$"),
                         ({"chain_sum": {"min_terms": True}}, r"^data.tasks.chain_sum.min_terms must be int like its "
                                                              r"default 2 \(got True\)$"),
                         ({"basic_arithmetic": {"min_terms": 2.0}}, r"^data.tasks.basic_arithmetic.min_terms must be int"),
                         ({"binary_alternation": {"p_solvable": float("nan")}},
                          r"^data.tasks.binary_alternation.p_solvable must be a finite number \(got nan\)$"),
                         ({"chain_sum": {"min_terms": 5, "max_terms": 3}},
                          r"^data.tasks.chain_sum: max_terms must be >= min_terms$")]:
        with pytest.raises(ConfigError, match=message):
            load_task(schemas.ReasoningGymData(tasks=bad, size=10, eval_size=5))
    # 2 one-digit terms make 200 problems: holding out all of them leaves none to train on
    small = {"chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}
    with pytest.raises(ConfigError, match="data.tasks.chain_sum: its generator gave only 0 training problems"):
        load_task(schemas.ReasoningGymData(tasks=small, size=10, eval_size=200))
    with pytest.raises(ConfigError, match="data.tasks.chain_sum: its generator gave only 200 distinct problems"):
        load_task(schemas.ReasoningGymData(tasks=small, size=10, eval_size=201))


def test_reasoning_gym_rewards_strict_accuracy_lenient_signal_and_format():
    from rlft.rewards.builtin import answer_format, lenient_answer, reasoning_gym_lenient, reasoning_gym_score
    forms = {"1 + 5 = 6": "6", "The answer is 6.": "6", "Answer: **6**": "6", "so\n\\boxed{6}": "6",
             "<answer> 6 </answer>": "6", "6": "6", "x = 3\nthen 1 + 5 = 6.": "6", "The final answer is: $6$": "6",
             "I think <answer>5</answer> no, the answer is 6": "5", "": ""}
    assert {text: lenient_answer(text) for text in forms} == forms
    train, _ = load_task(schemas.ReasoningGymData(tasks={"chain_sum": 1.0}, size=5, eval_size=2))
    problem = train[0]
    task, entry, answer = problem.fields["rg_task"], problem.fields["rg_entry"], problem.answer
    assert reasoning_gym_score(f"<answer>{answer}</answer>", task, entry) == 1.0
    assert reasoning_gym_score(f"The answer is {answer}", task, entry) == 0.0  # strict: the tags or nothing
    assert reasoning_gym_lenient(f"The answer is {answer}", task, entry) == 1.0
    assert reasoning_gym_lenient(f"The answer is {answer}1", task, entry) < 1.0  # partial credit at most
    assert answer_format(f"Sum it.\n<answer>{answer}</answer>\n") == 1.0
    for untidy in [answer, "<answer></answer>", f"<answer>{answer}</answer> because", "<answer>1</answer><answer>2</answer>"]:
        assert answer_format(untidy) == 0.0


def test_chat_template_renders_prompts_and_long_ones_are_dropped():
    from rlft.data.prompts import PromptEncoder, drop_long_prompts
    from rlft.types import Problem
    from rlft.models.loading import load_tokenizer, resolve_model_path
    tokenizer = load_tokenizer(resolve_model_path("builtin:tiny-adder"))
    plain = PromptEncoder(tokenizer)  # no template: plain text
    assert not plain.chat and plain("12+3=") == tokenizer.encode("12+3=")
    with pytest.raises(ConfigError, match="data.chat_template=true, but the model's tokenizer has no chat template"):
        PromptEncoder(tokenizer, chat_template=True)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}"
                               "{% if add_generation_prompt %}a:{% endif %}")
    templated = PromptEncoder(tokenizer, system_prompt="1")
    assert templated.chat
    assert templated("12+3=") == tokenizer.encode("s:1;u:12+3=;a:", add_special_tokens=False)
    assert PromptEncoder(tokenizer, chat_template=False)("12+3=") == tokenizer.encode("12+3=")
    problems = [Problem("1+1=", "2"), Problem("11+11=", "22")]
    kept, dropped = drop_long_prompts(problems, plain, max_tokens=4, what="training")
    assert [p.prompt for p in kept] == ["1+1="] and dropped == 1
    with pytest.raises(ConfigError, match="every one of the 2 training prompts is longer"):
        drop_long_prompts(problems, plain, max_tokens=2, what="training")


# ---- strict rows (issue 21): prompt and answer types, encodings, line ends, JSON arrays, CSV cells

def _load(path, map_fn=None):
    return load_problems(str(path), "train", "prompt", "answer", map_fn)


@pytest.mark.parametrize("line,message", [
    ('{"prompt": "1+1=", "answer": null}', r"d\.jsonl:2: answer 'answer' is null"),
    ('{"prompt": ["1+1="], "answer": "2"}', r"d\.jsonl:2: prompt 'prompt' is a list, not a string"),
    ('{"prompt": "1+1=", "answer": {"value": 2}}', r"d\.jsonl:2: answer 'answer' is a dict, not a string or number"),
    ('{"prompt": "1+1=", "answer": true}', r"d\.jsonl:2: answer 'answer' is a bool \(True\)"),
    ('{"prompt": "1+1=", "answer": NaN}', r"d\.jsonl:2: answer 'answer' is nan, not a finite number"),
    ('{"prompt": "1+1=", "answer": -Infinity}', r"d\.jsonl:2: answer 'answer' is -inf, not a finite number"),
    ('{"prompt": "1+1=", "answer": " "}', r"d\.jsonl:2: empty answer \(answer 'answer' holds only whitespace\)"),
    ('{"prompt": 12, "answer": "2"}', r"d\.jsonl:2: prompt 'prompt' is an int, not a string"),
    ('{"prompt": null, "answer": "2"}', r"d\.jsonl:2: prompt 'prompt' is null"),
    ('{"prompt": "1+1=", "answer": "2", "answer": "3"}', r"d\.jsonl:2: key 'answer' appears more than once"),
])
def test_prompt_and_answer_are_strict_with_the_line_named(tmp_path, line, message):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "0+1=", "answer": "1"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=message):
        _load(data)


def test_numeric_answers_get_one_written_form_and_other_fields_stay_as_they_are(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a", "answer": 42}\n{"prompt": "b", "answer": 42.0}\n{"prompt": "c", "answer": 0.5}\n'
                    '{"prompt": "d", "answer": 1e300, "x": null, "y": [1, {"k": 1, "k": 2}], "z": true, "z": false}\n')
    rows = _load(data)
    assert [r.answer for r in rows] == ["42", "42", "0.5", "1e+300"]
    assert rows[3].fields == {"x": None, "y": [1, {"k": 2}], "z": False}  # other fields: JSON's last-wins


def test_csv_rows_need_every_cell_and_a_prompt_and_answer(tmp_path):
    short = tmp_path / "short.csv"
    short.write_text("prompt,answer,topic\n1+1=,2,add\n2+2=,4\n")
    with pytest.raises(ConfigError, match=r"short\.csv:3: 2 cells, but the header has 3 columns"):
        _load(short)
    empty = tmp_path / "empty.csv"
    empty.write_text("prompt,answer,topic\n1+1=,,add\n")
    with pytest.raises(ConfigError, match=r"empty\.csv:2: empty answer \(answer 'answer' holds nothing\)"):
        _load(empty)
    (tmp_path / "ok.csv").write_text("prompt,answer,topic\n\n1+1=,2,\n")  # an empty other cell stays ""
    rows = _load(tmp_path / "ok.csv")
    assert [(r.prompt, r.answer, r.fields) for r in rows] == [("1+1=", "2", {"topic": ""})]
    (tmp_path / "twice.csv").write_text("prompt,answer,answer\n1+1=,2,3\n")
    with pytest.raises(ConfigError, match=r"twice\.csv:1: column 'answer' appears more than once"):
        _load(tmp_path / "twice.csv")


@pytest.mark.parametrize("name,text", [
    ("l.jsonl", '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\u00e9", "answer": "1"}\n'),
    ("l.csv", "prompt,answer\ncaf\u00e9,1\n1+1=,2\n"),
    ("l.json", '[{"prompt": "1+1=", "answer": "2"},\n {"prompt": "caf\u00e9", "answer": "1"}]\n'),
])
def test_a_file_that_is_not_utf8_names_its_line(tmp_path, name, text):
    data = tmp_path / name
    data.write_bytes(text.encode("latin-1"))
    column = text.splitlines()[1].index("\u00e9") + 1
    with pytest.raises(ConfigError, match=rf"l\.{name[2:]}:2: not UTF-8 \(byte 0xe9 at column {column}\)"):
        _load(data)


@pytest.mark.parametrize("bom", ["", "\ufeff"])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_byte_order_marks_and_crlf_line_ends_read_cleanly(tmp_path, bom, newline):
    rows = ['{"prompt": "1+1=", "answer": "2"}', '{"prompt": "2+2=", "answer": "4"}']
    (tmp_path / "d.jsonl").write_bytes((bom + newline.join(rows) + newline).encode())
    (tmp_path / "d.csv").write_bytes((bom + newline.join(["prompt,answer", "1+1=,2", '"2+2=",4']) + newline).encode())
    (tmp_path / "d.json").write_bytes((bom + "[" + ("," + newline).join(rows) + "]" + newline).encode())
    for name in ("d.jsonl", "d.csv", "d.json"):
        assert [(r.prompt, r.answer) for r in _load(tmp_path / name)] == [("1+1=", "2"), ("2+2=", "4")], name


def test_a_json_file_is_an_array_of_rows_or_json_lines(tmp_path):
    array = tmp_path / "a.json"
    array.write_text('[\n  {"prompt": "1+1=", "answer": 2, "level": 1},\n  {"prompt": "2+2=", "answer": "4"}\n]\n')
    rows = _load(array)
    assert [(r.prompt, r.answer, r.fields) for r in rows] == [("1+1=", "2", {"level": 1}), ("2+2=", "4", {})]
    lines = tmp_path / "l.json"
    lines.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    assert [r.prompt for r in _load(lines)] == ["1+1=", "2+2="]
    for text, message in {
        '[{"prompt": "x", "answer": "1"}, {"prompt": "y", "answer": null}]': r"a\.json row 1: answer 'answer' is null",
        '[{"prompt": "x", "answer": "1"}, ["y", "2"]]': r"a\.json row 1: expected a JSON object, got a list",
        '[{"prompt": "x", "answer": "1"},\n {"prompt": "y" "answer": "2"}]': r"a\.json:2: not valid JSON",
        '[]': "has no rows",
    }.items():
        array.write_text(text)
        with pytest.raises(ConfigError, match=message):
            _load(array)


def test_empty_files_and_a_directory_named_like_a_file(tmp_path):
    for name, text in [("e.jsonl", ""), ("b.jsonl", "\n  \n\r\n"), ("e.csv", ""), ("h.csv", "prompt,answer\n\n"),
                       ("e.json", ""), ("b.json", " \n")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=r"has no rows"):
            _load(tmp_path / name)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(ConfigError, match=r"data file '.*dir\.jsonl' is a directory"):
        _load(tmp_path / "dir.jsonl")


def test_parquet_prompt_and_answer_columns_are_strict_too(tmp_path):
    import pyarrow
    import pyarrow.parquet
    pyarrow.parquet.write_table(pyarrow.table({"prompt": ["a?", "b?"], "answer": [1, 22]}), tmp_path / "i.parquet")
    assert [r.answer for r in _load(tmp_path / "i.parquet")] == ["1", "22"]
    pyarrow.parquet.write_table(pyarrow.table({"prompt": ["a?", "b?"], "answer": ["1", None]}), tmp_path / "n.parquet")
    with pytest.raises(ConfigError, match=r"n\.parquet row 1: answer 'answer' is null"):
        _load(tmp_path / "n.parquet")


def test_what_a_mapping_function_returns_is_checked_the_same_way(tmp_path, monkeypatch):
    (tmp_path / "strict_map.py").write_text("def listed(row):\n    return {'prompt': row['q'], 'answer': [row['a']]}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "d.jsonl").write_text('{"q": "1+1=", "a": "2"}\n')
    with pytest.raises(ConfigError, match=r"d\.jsonl:1: answer 'answer' from data.map_fn 'strict_map:listed' is a "
                                          r"list, not a string or number"):
        _load(tmp_path / "d.jsonl", "strict_map:listed")


def test_prompts_are_limited_to_what_fits_in_the_models_context_with_a_response():
    from rlft.data.prompts import context_limit, describe_limit, drop_long_prompts
    from rlft.types import Problem
    assert context_limit(None, 256, None) is None                  # nothing known: no limit
    assert context_limit(None, 256, 100) == 100
    assert context_limit(2048, 256, None) == 1792                  # the context decides, without max_prompt_tokens
    assert context_limit(2048, 256, 512) == 512 and context_limit(2048, 256, 4096) == 1792
    with pytest.raises(ConfigError, match="rollout.max_new_tokens=64 leaves no room for a prompt in the model's "
                                          "context of 64 positions"):
        context_limit(64, 64, None)
    assert describe_limit(2048, 256, 512) == "data.max_prompt_tokens=512"
    assert describe_limit(2048, 256, None) == ("the model's context (2048 positions - rollout.max_new_tokens=256 "
                                               "= 1792 prompt tokens)")
    # With no data.max_prompt_tokens, what can't fit with its response is dropped and counted all the same.
    problems, limits = [Problem("1+1=", "2"), Problem("9" * 60, "1")], (64, 8, None)
    kept, dropped = drop_long_prompts(problems, list, context_limit(*limits), "training", describe_limit(*limits))
    assert [p.prompt for p in kept] == ["1+1="] and dropped == 1
    with pytest.raises(ConfigError, match=r"the model's context \(64 positions - rollout.max_new_tokens=8 = 56 prompt "
                                          r"tokens\): every one of the 1 held-out prompts is longer"):
        drop_long_prompts(problems[1:], list, context_limit(*limits), "held-out", describe_limit(*limits))


# ---- bad inputs found by scripts/bad_inputs.py (docs/bad_inputs.md) ----------------------------------------

@pytest.mark.parametrize("name, content, message", [
    ("n.csv", b"prompt,answer\n1+1=,2\n2+2=\x00,4\n",
     r"n\.csv:3: a NUL byte at column 5 \(a binary or damaged file\?\)"),
    ("n.jsonl", b'{"prompt": "1+1=", "answer": "2"}\n\x00\n', r"n\.jsonl:2: a NUL byte at column 1"),
])
def test_a_nul_byte_is_refused_with_its_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path / name)


def test_a_json_file_holding_one_pretty_printed_object_is_refused_by_name(tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]
    (tmp_path / "o.json").write_text(json.dumps({"version": 1, "data": rows}, indent=2))
    with pytest.raises(ConfigError, match=r"o\.json: one JSON object \(keys: version, data\), not an array of row "
                                          r"objects or JSON Lines; are the rows its 'data' list\?"):
        _load(tmp_path / "o.json")
    (tmp_path / "p.json").write_text(json.dumps(rows[0], indent=2))
    with pytest.raises(ConfigError, match=r"p\.json: one JSON object \(keys: prompt, answer\), not an array"):
        _load(tmp_path / "p.json")
    one = {"prompt": "1+1=", "answer": "2", "steps": [{"op": "+"}]}
    (tmp_path / "one.json").write_text(json.dumps(one) + "\n")  # on one line: JSON Lines of one row
    assert [(r.prompt, r.fields) for r in _load(tmp_path / "one.json")] == [("1+1=", {"steps": [{"op": "+"}]})]


def test_a_split_named_for_a_file_is_refused(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "answer": "{i + 1}"}}\n' for i in range(30)))
    with pytest.raises(ConfigError, match=r"data.eval_split=test: '.*d\.jsonl' is one file, with no splits "
                                          r"\(held-out rows from another file: data.eval_path=FILE"):
        load_task(schemas.DatasetData(path=str(data), eval_split="test"))
    with pytest.raises(ConfigError, match=r"data.split=validation: '.*d\.jsonl' is one file, with no splits"):
        load_task(schemas.DatasetData(path=str(data), split="validation"))
    with pytest.raises(ConfigError, match=r"data.eval_split=test: '.*e\.csv' is one file"):
        load_task(schemas.DatasetData(path=str(tmp_path), eval_path=str(tmp_path / "e.csv"), eval_split="test"))


def test_the_prompt_and_answer_keys_differ():
    from rlft.config.compose import compose, to_run_config
    from rlft.config import validate
    with pytest.raises(ConfigError, match="data.prompt_key and data.answer_key are both 'q': the answer would be"):
        validate(to_run_config(*compose(["data=dataset", "data.path=d.jsonl", "data.prompt_key=q",
                                         "data.answer_key=q"])))
    validate(to_run_config(*compose(["data=dataset", "data.path=d.jsonl", "data.answer_key=prompt",
                                     "data.map_fn=m:f"])))  # a map_fn names its own keys


def test_a_mapping_function_that_calls_sys_exit_is_named(tmp_path, monkeypatch):
    (tmp_path / "exit_map.py").write_text("import sys\ndef row(r):\n    sys.exit('bad row')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"d\.jsonl:1: data.map_fn 'exit_map:row' raised SystemExit: bad row"):
        _load(tmp_path / "d.jsonl", "exit_map:row")


def test_a_prompt_too_long_for_any_tokenization_is_dropped_without_encoding_it():
    from rlft.data.prompts import PromptEncoder, drop_long_prompts
    from rlft.models.loading import load_tokenizer, resolve_model_path
    from rlft.types import Problem
    encoded = []

    class Counting(PromptEncoder):
        def __call__(self, prompt):
            encoded.append(len(prompt))
            return super().__call__(prompt)

    encode = Counting(load_tokenizer(resolve_model_path("builtin:tiny-adder")))
    huge = Problem("1+" * 5_000_000 + "1=", "1")  # a 10 MB line: a minute in this tokenizer
    kept, dropped = drop_long_prompts([Problem("1+1=", "2"), huge], encode, 56, "training")
    assert [p.prompt for p in kept] == ["1+1="] and dropped == 1
    assert encoded == [4]  # the huge one was never encoded
    # not encoded only when no tokenization could fit it: 4 x the longest token x (limit + 1) characters
    assert len(huge.prompt) > 4 * encode.longest_token * 57
