"""SmolLM2-135M-Instruct on the calculator environment with its own chat template (ChatML) and the tiny
`<call>EXPRESSION</call>` tool-call format, shown three worked examples before each problem. A 135M model
does not call a tool from a system prompt alone: with one example it never called (Hermes or tiny), with
three it calls on 78-84% of sampled first turns (a probe of 15 prompt variants, 64 samples each; Hermes
JSON with three examples reached 44-58%, its calls being 34 tokens against 14). A measurement, not a
benchmark:

    make smollm2
    python scripts/smollm2_tools.py --steps 10        # rlft train with the env below; prints each row

The environment is `FewShotCalculator` here (env=custom env.environment=smollm2_tools:FewShotCalculator).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rlft.envs import ToolEnv
from rlft.envs.tools import calculator

ROOT = Path(__file__).resolve().parent.parent
LEAD = "Let me use the calculator.\n"
EXAMPLES = [("2314*512", "1184768"), ("7618*489", "3725202"), ("4278*713", "3050214")]


class FewShotCalculator(ToolEnv):
    tools = [calculator]
    system_prompt = ("Use the calculator for products: write <call>EXPRESSION</call> and wait for the result, "
                     "then reply with only the number it returns.")

    def reset(self, problem):
        shots = []
        for expression, value in EXAMPLES:
            shots += [{"role": "user", "content": f"{expression}="},
                      {"role": "assistant", "content": f"{LEAD}<call>{expression}</call>"},
                      {"role": "tool", "content": value},
                      {"role": "assistant", "content": value}]
        return [{"role": "system", "content": self.system_prompt}, *shots,
                {"role": "user", "content": problem.prompt}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "runs/smollm2_tools")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    command = [sys.executable, "-m", "rlft.cli", "train", "model=smollm2_135m", "env=custom",
               "env.environment=smollm2_tools:FewShotCalculator", "data=calculator", "env.tool_format=tiny",
               "env.max_tokens=96", "env.max_turn_tokens=48", "trainer.prompts_per_step=4", "algo.group_size=4",
               "data.eval_size=16", f"trainer.steps={args.steps}", f"trainer.eval_every={max(1, args.steps // 2)}",
               "algo.kl_coef=0", "optim.lr=5e-6", "optim.warmup_steps=1", "reward.fns=[answer_match]",
               "reward.accuracy=answer_match", f"hydra.run.dir={args.out}", *args.overrides]
    subprocess.run(command, check=True, env=os.environ | {"PYTHONPATH": str(ROOT / "scripts")})
    rows = [json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        keys = ["step", "kind", "eval/accuracy", "eval/episode/tool_call_rate", "eval/episode/turns_mean",
                "train/reward_mean", "episode/tool_call_rate", "episode/turns_mean", "episode/answer_from_tool",
                "perf/step_seconds", "perf/generate_seconds", "perf/train_seconds"]
        print({k: round(row[k], 3) if isinstance(row.get(k), float) else row.get(k) for k in keys if k in row})


if __name__ == "__main__":
    main()
