"""The calculator task: a 4-digit times a 3-digit number, "1234*567=" -> "699678", with a calculator tool.

Too hard for the shipped tiny model (rlft/models/tiny_calculator) to do in its head, easy with the tool.
An episode is one token sequence; the model ends each of its turns with <eos>:

    direct answer:   1234*567=  699678<eos>
    with the tool:   1234*567=  <call>1234*567</call><eos>  <result>699678</result>  699678<eos>

A turn `<call>EXPR</call>` asks the environment to evaluate EXPR (`evaluate_expression`: digits and
+ - * only); it answers with the observation `<result>VALUE</result>`, and the model takes another turn.
The final answer is the text of the last assistant turn. As chat messages (the tokenizer's chat template
renders exactly the sequence above): user "1234*567=", assistant "<call>1234*567</call>", tool
"699678", assistant "699678".

The train and held-out sets are drawn with separate seeded generators, held-out first, and no operand
pair is in both (see rlft/data/unique.py), so the held-out problems are never trained on, neither by the
SFT build script nor by RL.

`teacher_episode` is the SFT teacher of the shipped tiny model. It stands in for an imperfect SFT
dataset and leaves RL two things to learn:
- when to call: it calls the tool with probability `call_prob_low` (0.6) when a's first digit is 1-3 and
  `call_prob_high` (0.15) otherwise, so about 30% of its episodes call, and a greedy model calls on the
  problems with a in 1000..3999 (a third) and never on the others;
- how to copy: the call's expression is always the problem's exact expression, but the final answer
  copies the result correctly only with probability `copy_right` (0.65); otherwise one digit is changed
  or dropped (`sloppy_copy`).
Without the tool it writes a "head" answer: the right length and the right two leading digits, the rest
random, never the right answer (`head_answer`). A policy that always calls and copies exactly scores 1.0.
"""

from __future__ import annotations

import random
import re

from rlft.data.multistep import evaluate_arithmetic
from rlft.data.unique import draw_unique
from rlft.types import Problem

CALL, END_CALL, RESULT, END_RESULT = "<call>", "</call>", "<result>", "</result>"
TOOL_TOKENS = (CALL, END_CALL, RESULT, END_RESULT)

MIN_A, MAX_A = 1000, 9999
MIN_B, MAX_B = 100, 999

# The teacher's defaults (scripts/build_tiny_model.py --arch calculator uses them).
CALL_PROB_LOW = 0.6    # a's first digit is 1-3
CALL_PROB_HIGH = 0.15  # a's first digit is 4-9
COPY_RIGHT = 0.65

_CALL_RE = re.compile(re.escape(CALL) + r"(.*)" + re.escape(END_CALL), re.DOTALL)
_EXPRESSION_RE = re.compile(r"\d{1,20}(?:[*+-]\d{1,20}){0,7}")


def multiplication_problem(a: int, b: int) -> Problem:
    return Problem(prompt=f"{a}*{b}=", answer=str(a * b))


def operands(problem: Problem) -> tuple[int, int]:
    a, b = problem.prompt.removesuffix("=").split("*")
    return int(a), int(b)


def expression(problem: Problem) -> str:
    """The expression to hand the calculator: the prompt without its "="."""
    return problem.prompt.removesuffix("=")


def split_problems(eval_size: int, split_seed: int, size: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): `size` training and `eval_size` held-out problems, no operand pair in both. Each
    list is a prefix of the one a larger size (with the same seed) gives."""
    if size < 1 or eval_size < 0:
        raise ValueError(f"size={size}, eval_size={eval_size}: need size >= 1 and eval_size >= 0")
    taken: set[str] = set()
    eval_rng = random.Random(f"calculator-eval:{split_seed}")
    train_rng = random.Random(f"calculator-train:{split_seed}")

    def draw(rng: random.Random):
        return lambda: multiplication_problem(rng.randint(MIN_A, MAX_A), rng.randint(MIN_B, MAX_B))

    def key(problem: Problem) -> str:
        return problem.prompt

    held_out = draw_unique(draw(eval_rng), key, eval_size, taken)
    return draw_unique(draw(train_rng), key, size, taken), held_out


# --- the tool -------------------------------------------------------------------------------------------


def parse_call(text: str) -> str | None:
    """The expression of a tool-call turn `<call>EXPR</call>` (the whole turn, <eos> already removed);
    None when the turn is not a call."""
    match = _CALL_RE.fullmatch(text.strip())
    return match.group(1) if match else None


def evaluate_expression(text: str) -> str | None:
    """The calculator: the value of an expression of integers with + - * (usual precedence), as a string;
    None when it is anything else (nothing is eval'd; at most 8 numbers of up to 20 digits)."""
    text = text.strip()
    if not _EXPRESSION_RE.fullmatch(text):
        return None
    return str(evaluate_arithmetic(text))


def tool_observation(value: str) -> str:
    """The observation after a call, as the episode's tokens spell it."""
    return f"{RESULT}{value}{END_RESULT}"


# --- the SFT teacher ------------------------------------------------------------------------------------


def teacher_calls(a: int, rng: random.Random, call_prob_low: float = CALL_PROB_LOW,
                  call_prob_high: float = CALL_PROB_HIGH) -> bool:
    """Whether the teacher calls the tool: more often when a is small (first digit 1-3)."""
    return rng.random() < (call_prob_low if str(a)[0] in "123" else call_prob_high)


def sloppy_copy(value: str, rng: random.Random, copy_right: float = COPY_RIGHT) -> str:
    """`value` copied right with probability `copy_right`; otherwise one digit changed or dropped."""
    if rng.random() < copy_right:
        return value
    i = rng.randrange(len(value))
    if len(value) > 1 and rng.random() < 0.5:
        return value[:i] + value[i + 1:]                                  # dropped
    digits = "123456789" if i == 0 else "0123456789"                      # no leading zero
    return value[:i] + rng.choice(digits.replace(value[i], "")) + value[i + 1:]  # changed


def head_answer(a: int, b: int, rng: random.Random) -> str:
    """A guess without the tool: the product's length and two leading digits, the rest random; never right."""
    right = str(a * b)
    while True:
        guess = right[:2] + "".join(rng.choice("0123456789") for _ in range(len(right) - 2))
        if guess != right:
            return guess


def teacher_episode(a: int, b: int, rng: random.Random, call_prob_low: float = CALL_PROB_LOW,
                    call_prob_high: float = CALL_PROB_HIGH, copy_right: float = COPY_RIGHT) -> list[dict]:
    """One teacher episode as chat messages: [user, assistant] without the tool, [user, assistant call,
    tool, assistant] with it. The call's expression is always the problem's expression."""
    problem = multiplication_problem(a, b)
    messages = [{"role": "user", "content": problem.prompt}]
    if not teacher_calls(a, rng, call_prob_low, call_prob_high):
        return messages + [{"role": "assistant", "content": head_answer(a, b, rng)}]
    value = evaluate_expression(expression(problem))
    return messages + [{"role": "assistant", "content": f"{CALL}{expression(problem)}{END_CALL}"},
                       {"role": "tool", "content": value},
                       {"role": "assistant", "content": sloppy_copy(value, rng, copy_right)}]
