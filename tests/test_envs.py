"""Multi-turn episodes (rlft.envs): token in, token out, the loss mask, template rewrites, tools, budgets."""

from __future__ import annotations

import string
import threading
import time

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlft.envs import EpisodeSetup, Observation, ToolEnv
from rlft.envs.base import ToolCall
from rlft.envs.chat import EpisodeTokenizer
from rlft.envs.parsers import parse_hermes, parse_tiny, pick_format
from rlft.envs.tools import ToolRunner, as_tool_output, calculator, resolve_tools, tool_schema
from rlft.errors import ConfigError
from rlft.rollout.batching import right_pad
from rlft.types import Problem, Rollout, SamplingParams

CHARS = string.printable  # one token per character
SPECIALS = ["<call>", "</call>", "<result>", "</result>"]
TINY_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% elif m['role'] == "
                 "'assistant' %}{{ m['content'] }}<eos>{% elif m['role'] == 'tool' %}<result>{{ m['content'] }}"
                 "</result>{% endif %}{% endfor %}")
# Like Qwen3's: an earlier assistant turn loses its "think:...;" prefix when rendered again.
REWRITING_TEMPLATE = TINY_TEMPLATE.replace(
    "{{ m['content'] }}<eos>", "{% if loop.last %}{{ m['content'] }}{% else %}"
                               "{{ m['content'].split(';')[-1] }}{% endif %}<eos>")


def char_tokenizer(template: str = TINY_TEMPLATE) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1} | {s: i + 2 for i, s in enumerate(SPECIALS)} | \
        {c: i + 2 + len(SPECIALS) for i, c in enumerate(CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # newlines too
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.chat_template = template
    return fast


class ScriptedEngine:
    """Answers each request with the ids a script gives for its history text; log-prob -0.5 per token.
    Records every request, so a test sees exactly what the engine was asked to continue."""

    def __init__(self, tokenizer, script, max_new_tokens_seen=None):
        self.tokenizer, self.script, self.requests = tokenizer, script, []

    def generate(self, prompts, params):
        responses, truncated = [], []
        for prompt in prompts:
            self.requests.append(list(prompt))
            ids = self.tokenizer.encode(self.script(self.tokenizer.decode(prompt)), add_special_tokens=False) + [1]
            truncated.append(len(ids) > params.max_new_tokens)
            responses.append(ids[:params.max_new_tokens])
        from rlft.rollout.batching import left_pad
        prompt_ids, prompt_mask = left_pad(prompts, 0)
        ids, mask = right_pad(responses, 0, torch.long)
        logprobs, _ = right_pad([[-0.5] * len(r) for r in responses], 0.0, torch.float32)
        return Rollout(prompt_ids, prompt_mask, ids, mask, logprobs, torch.tensor(truncated))


def calculator_script(history: str) -> str:
    """Calls the tool once, then answers with its result (a 'think:...;' prefix on the tool call)."""
    if "<result>" in history:
        return history.rsplit("<result>", 1)[1].split("</result>")[0]
    question = history.split("=")[0]
    return f"think:{len(question)};<call>{question}</call>"


class Calc(ToolEnv):
    tools = [calculator]


class Config:
    environment = "tests.test_envs:Calc"
    tools: list = []
    max_turns = 3
    max_tokens = 64
    max_turn_tokens = None
    system_prompt = None
    tool_timeout_s = 5.0
    tool_format = "tiny"


def run_episodes(tokenizer, script, problems, n=2, cfg=Config, max_new_tokens=24):
    setup = EpisodeSetup(cfg, tokenizer)
    engine = ScriptedEngine(tokenizer, script)
    runner = setup.runner(engine)
    try:
        return runner.run(problems, SamplingParams(n=n, max_new_tokens=max_new_tokens)), engine
    finally:
        runner.runner.close()


PROBLEMS = [Problem("1234*567=", "699678"), Problem("12*3=", "36")]


def test_trained_ids_are_exactly_the_sampled_ids_and_the_mask_is_one_only_on_them():
    tokenizer = char_tokenizer()
    episodes, engine = run_episodes(tokenizer, calculator_script, PROBLEMS)
    r = episodes.rollout
    assert r.size == 4 and episodes.completions == ["699678", "699678", "36", "36"]
    for row in range(r.size):
        ids = r.response_ids[row][r.response_mask[row].bool()].tolist()
        sampled = r.sampled_mask[row][r.response_mask[row].bool()].tolist()
        # what the engine produced for this episode's two turns, in order, with the observation between
        prompt = r.prompt_ids[row][r.prompt_mask[row].bool()].tolist()
        turn1 = tokenizer.encode(calculator_script(tokenizer.decode(prompt)), add_special_tokens=False) + [1]
        observation = tokenizer.encode("<result>" + episodes.completions[row] + "</result>", add_special_tokens=False)
        turn2 = tokenizer.encode(episodes.completions[row], add_special_tokens=False) + [1]
        assert ids == turn1 + observation + turn2
        assert sampled == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
        # the engine was asked to continue exactly the sequence so far: no re-tokenised history
        assert engine.requests[len(PROBLEMS) * 2 + row] == prompt + turn1 + observation
    # engine log-probs on sampled tokens, zero on observations; the policy's lengths count sampled tokens only
    assert torch.equal(r.logprobs != 0, r.sampled_mask.bool())
    assert r.response_lengths.tolist() == r.sampled_mask.sum(-1).tolist()
    stats = episodes.stats
    assert stats.turns.tolist() == [2] * 4 and stats.tool_calls.tolist() == [1] * 4 and stats.cut == ["done"] * 4
    assert stats.answer_from_tool.all() and (stats.observation_tokens > 0).all()
    assert not r.truncated.any()


def test_a_template_that_rewrites_earlier_turns_does_not_change_the_trained_sequence():
    plain, _ = run_episodes(char_tokenizer(), calculator_script, PROBLEMS[:1], n=1)
    rewriting_tokenizer = char_tokenizer(REWRITING_TEMPLATE)
    rewritten, _ = run_episodes(rewriting_tokenizer, calculator_script, PROBLEMS[:1], n=1)
    assert torch.equal(plain.rollout.response_ids, rewritten.rollout.response_ids)
    assert torch.equal(plain.rollout.sampled_mask, rewritten.rollout.sampled_mask)
    # ...whereas rendering the conversation again, as re-tokenising trainers do, loses the sampled "think:" part
    messages = [{"role": "user", "content": "1234*567="}, {"role": "assistant", "content": "think:8;<call>1234*567</call>"},
                {"role": "tool", "content": "699678"}, {"role": "assistant", "content": "699678"}]
    rerendered = rewriting_tokenizer.apply_chat_template(messages, tokenize=False)
    assert "think:8;" not in rerendered
    assert "think:8;" in rewriting_tokenizer.decode(rewritten.rollout.response_ids[0])


def test_budgets_cut_episodes_by_turns_and_tokens():
    always_call = lambda history: "<call>1+1</call>"  # noqa: E731
    cfg = type("C", (Config,), {"max_turns": 2})
    episodes, _ = run_episodes(char_tokenizer(), always_call, PROBLEMS[:1], n=1, cfg=cfg)
    assert episodes.stats.cut == ["turns"] and episodes.stats.turns.tolist() == [2]
    assert episodes.rollout.truncated.tolist() == [True]
    cfg = type("C", (Config,), {"max_tokens": 12})
    episodes, _ = run_episodes(char_tokenizer(), lambda h: "think:12345678;<call>1+1</call>", PROBLEMS[:1], n=1,
                               cfg=cfg)
    assert episodes.stats.cut == ["tokens"]
    assert episodes.rollout.response_mask.sum().item() == 12  # cut exactly at the budget, as sampled
    cfg = type("C", (Config,), {"max_turn_tokens": 5})
    episodes, engine = run_episodes(char_tokenizer(), lambda h: "think:12345678;<call>1+1</call>", PROBLEMS[:1],
                                    n=1, cfg=cfg)
    assert episodes.stats.cut == ["tokens"] and episodes.rollout.response_mask.sum().item() == 5


class ContextLimitedEngine(ScriptedEngine):
    """Stops every answer after 3 tokens, reporting it truncated, as vLLM does at its max_model_len: short of
    the turn's budget and of any chunk."""

    def generate(self, prompts, params):
        out = super().generate(prompts, SamplingParams(n=1, max_new_tokens=min(3, params.max_new_tokens)))
        return Rollout(out.prompt_ids, out.prompt_mask, out.response_ids, out.response_mask, out.logprobs,
                       torch.ones(len(prompts), dtype=torch.bool))


@pytest.mark.parametrize("chunk", [None, 8])
def test_an_engine_that_stops_short_cuts_the_turn_instead_of_asking_again(chunk):
    tokenizer = char_tokenizer()
    setup = EpisodeSetup(Config, tokenizer)
    engine = ContextLimitedEngine(tokenizer, calculator_script)
    runner = setup.runner(engine)
    try:
        episodes = runner.start(PROBLEMS[0], 1)
        calls = 0
        while not episodes[0].done and calls < 10:
            runner.advance(episodes, SamplingParams(n=1, max_new_tokens=24), chunk_tokens=chunk)
            calls += 1
    finally:
        runner.runner.close()
    # neither the turn's budget nor a chunk of 8 was used up: the engine's own limit, so the turn is cut there
    assert episodes[0].cut == "tokens" and calls == 1 and len(episodes[0].ids) == 3


class Slow(ToolEnv):
    pass


def test_a_hanging_tool_cuts_its_episode_at_the_timeout_and_the_batch_finishes():
    release = threading.Event()

    def lookup(key: str) -> str:
        """Looks a key up.

        Args:
            key: what to look up
        """
        if key == "hang":
            release.wait(30)
        return "v"

    env = type("E", (ToolEnv,), {"tools": [lookup]})
    cfg = type("C", (Config,), {"tool_timeout_s": 0.5})
    setup = EpisodeSetup(cfg, char_tokenizer())
    setup.env_class = env
    setup.tools = resolve_tools([]) + __import__("rlft.envs", fromlist=["_function_tools"])._function_tools([lookup])
    script = lambda h: "a" if "<result>" in h else ("<call>hang</call>" if h.startswith("1234") else "<call>k</call>")  # noqa: E731
    runner = setup.runner(ScriptedEngine(char_tokenizer(), script))
    started = time.monotonic()
    try:
        episodes = runner.run(PROBLEMS, SamplingParams(n=1, max_new_tokens=24))
    finally:
        release.set()
        runner.runner.close()
    assert time.monotonic() - started < 10
    assert episodes.stats.cut == ["tool_timeout", "done"]
    assert episodes.completions[1] == "a" and episodes.stats.tool_errors.tolist() == [1, 0]


def test_parsers_read_hermes_and_tiny_calls():
    tools = resolve_tools(["calculator"])
    calls, errors = parse_hermes('x <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}'
                                 '</tool_call><tool_call>{bad json</tool_call>', tools)
    assert calls == [ToolCall("calculator", {"expression": "2*3"})] and len(errors) == 1
    assert parse_tiny("<call>2*3</call>", tools) == ([ToolCall("calculator", {"expression": "2*3"})], [])
    assert parse_tiny("6", tools) == ([], [])
    assert pick_format("auto", char_tokenizer()) == "tiny"
    with pytest.raises(ConfigError, match="tool format"):
        pick_format("xml", char_tokenizer())


def test_tool_schema_and_outputs_are_strict():
    schema = tool_schema(calculator)["function"]
    assert schema["name"] == "calculator" and schema["parameters"]["required"] == ["expression"]
    assert "1234*567" in schema["parameters"]["properties"]["expression"]["description"]
    assert as_tool_output(3) == "3" and as_tool_output({"a": 1}) == '{"a": 1}'
    with pytest.raises(TypeError, match="returns its output as a str"):
        as_tool_output(None)
    runner = ToolRunner(resolve_tools(["calculator"]), 2.0)
    try:
        results = runner.run([ToolCall("calculator", {"expression": "1234*567"}),
                              ToolCall("calculator", {"expression": "9**9**9"}), ToolCall("nope", {}),
                              ToolCall("calculator", {"expr": "1"})])
    finally:
        runner.close()
    assert [r.output for r in results][0] == "699678"
    assert [r.error for r in results] == [False, True, True, True]
    assert "unknown tool 'nope'" in results[2].output and "unknown argument(s) expr" in results[3].output


def test_user_tools_run_in_the_worker_pool_with_their_timeout(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(
        "import os, time\n"
        "def where(x: str) -> str:\n    '''pid.\n\n    Args:\n        x: anything\n    '''\n    return str(os.getpid())\n"
        "def hang(x: str) -> str:\n    '''hangs.\n\n    Args:\n        x: anything\n    '''\n    time.sleep(60)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    runner = ToolRunner(resolve_tools(["my_tools:where", "my_tools:hang"]), 1.0)
    try:
        started = time.monotonic()
        results = runner.run([ToolCall("where", {"x": "1"}), ToolCall("hang", {"x": "1"})])
    finally:
        runner.close()
    import os
    assert results[0].output.isdigit() and int(results[0].output) != os.getpid()  # another process
    assert results[1].timed_out and time.monotonic() - started < 30


def test_setup_refuses_a_model_without_a_chat_template_and_unknown_environments():
    tokenizer = char_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="chat template"):
        EpisodeSetup(Config, tokenizer)
    with pytest.raises(ConfigError, match="unknown environment 'nope'"):
        EpisodeSetup(type("C", (Config,), {"environment": "nope"}), char_tokenizer())
    with pytest.raises(ConfigError, match="json:JSONDecoder is not an environment: it has no reset or step"):
        EpisodeSetup(type("C", (Config,), {"environment": "json:JSONDecoder"}), char_tokenizer())
    with pytest.raises(ConfigError, match="making an instance failed: TypeError"):
        EpisodeSetup(type("C", (Config,), {"environment": "json:dumps"}), char_tokenizer())
    with pytest.raises(ConfigError, match="a tool of that name is the environment's own already"):
        EpisodeSetup(type("C", (Config,), {"environment": "calculator", "tools": ["calculator"]}), char_tokenizer())


def test_observation_ids_follow_the_template_between_turns():
    chat = EpisodeTokenizer(char_tokenizer(), [], "tiny")
    ids = chat.observation_ids([{"role": "tool", "content": "42"}], "<eos>")
    assert char_tokenizer().decode(ids) == "<result>42</result>"
    env_obs = Observation(messages=[{"role": "user", "content": "again"}])
    assert char_tokenizer().decode(chat.observation_ids(env_obs.messages, "<eos>")) == "again"


def test_the_python_tool_runs_the_models_program_in_the_sandbox():
    script = lambda h: h.rsplit("<result>", 1)[1].split("</result>")[0].strip() if "<result>" in h \
        else "<call>import os\nprint(6*7, os.getuid() == 0)</call>"  # noqa: E731
    cfg = type("C", (Config,), {"environment": "python"})
    episodes, _ = run_episodes(char_tokenizer(), script, [Problem("what is six times seven?", "42")], n=1, cfg=cfg)
    assert episodes.stats.cut == ["done"] and episodes.stats.tool_errors.tolist() == [0]
    assert episodes.completions == ["42 False"]  # printed in the sandbox, not as root as the trainer is


def test_code_repair_feeds_test_failures_back_until_the_tests_pass():
    problem = Problem("def add(a, b):\n", "", fields={"test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                                                       "entry_point": "add"})
    script = lambda h: "    return a + b" if "failed" in h else "    return a - b"  # noqa: E731
    cfg = type("C", (Config,), {"environment": "code_repair", "max_tokens": 400})
    episodes, engine = run_episodes(char_tokenizer(), script, [problem], n=1, cfg=cfg)
    assert episodes.stats.turns.tolist() == [2] and episodes.stats.cut == ["done"]
    assert episodes.completions == ["    return a + b"]
    assert "The tests failed" in char_tokenizer().decode(engine.requests[1])
    always_wrong, _ = run_episodes(char_tokenizer(), lambda h: "    return a - b", [problem], n=1,
                                   cfg=type("C", (cfg,), {"max_turns": 2}))
    assert always_wrong.stats.cut == ["turns"]


def test_the_readme_environment_works_as_written(tmp_path, monkeypatch):
    """The README's example environment (myenv.py), as printed there: its tool is called, its reward counted."""
    from conftest import ROOT
    readme = (ROOT / "README.md").read_text()
    lines = readme.split("    # myenv.py\n", 1)[1].splitlines()
    end = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("    "))
    code = "\n".join(line[4:] for line in lines[:end])  # the indented block, up to the next paragraph
    assert len([line for line in code.splitlines() if line.strip()]) < 30  # the README promises under 30 lines
    (tmp_path / "myenv.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    script = lambda h: "France" if "<result>" in h else '<tool_call>{"name": "country", "arguments": {"city": "Paris"}}</tool_call>'  # noqa: E731
    cfg = type("C", (Config,), {"environment": "myenv:Lookup", "tool_format": "hermes", "max_tokens": 400})
    episodes, engine = run_episodes(char_tokenizer(), script, [Problem("Which country is Paris in?", "France")], n=1,
                                    cfg=cfg)
    assert episodes.completions == ["France"] and episodes.stats.cut == ["done"]
    assert episodes.stats.tool_calls.tolist() == [1] and episodes.stats.tool_errors.tolist() == [0]
    assert episodes.stats.env_rewards.tolist() == pytest.approx([-0.1])


@pytest.mark.openenv
def test_an_openenv_environment_defined_here_runs_through_the_adapter():
    """OpenEnv (openenv-core): an Environment subclass with its pydantic Action and Observation, in process."""
    pytest.importorskip("openenv.core.env_server.interfaces")
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation as OpenEnvObservation, State

    from rlft.envs.openenv import from_openenv

    class GuessAction(Action):
        guess: str

    class GuessObservation(OpenEnvObservation):
        feedback: str = ""

    class GuessNumber(Environment):  # the secret is 7: "higher"/"lower" until the model says it
        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(episode_id="e", step_count=0)
            return GuessObservation(feedback="guess a number from 1 to 9")

        def step(self, action, timeout_s=None, **kwargs):
            self._state.step_count += 1
            guess = int(action.guess.strip() or 0)
            if guess == 7:
                return GuessObservation(feedback="right", done=True, reward=1.0)
            return GuessObservation(feedback="higher" if guess < 7 else "lower", reward=-0.1)

        @property
        def state(self):
            return self._state

    module = type(__import__("sys"))("openenv_guess")
    module.Guess = from_openenv(GuessNumber, GuessAction)
    __import__("sys").modules["openenv_guess"] = module
    try:
        script = lambda h: "7" if "higher" in h else "3"  # noqa: E731
        cfg = type("C", (Config,), {"environment": "openenv_guess:Guess", "max_tokens": 200})
        episodes, engine = run_episodes(char_tokenizer(), script, [Problem("Find the secret.", "7")], n=1, cfg=cfg)
    finally:
        del __import__("sys").modules["openenv_guess"]
    assert episodes.stats.turns.tolist() == [2] and episodes.stats.cut == ["done"]
    assert episodes.stats.env_rewards.tolist() == pytest.approx([0.9])
    assert "guess a number from 1 to 9" in char_tokenizer().decode(engine.requests[0])
    assert "higher" in char_tokenizer().decode(engine.requests[1])
