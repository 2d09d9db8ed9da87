# Every target sets itself up: a fresh machine needs only Python 3.10-3.12 and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp makes a second `make test` skip the install; it is redone when pyproject.toml changes.
STAMP := $(VENV)/.installed
TORCH_INDEX ?=

.PHONY: setup test test-core lint e2e demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first: a plain dependency resolve would pull a multi-GB CUDA build. Where no CPU wheel
	# is found locally, pass TORCH_INDEX=https://download.pytorch.org/whl/cpu.
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	# The trl extra too: TRL's GRPOTrainer for tests/trl and the TRL e2e, and every verl test then runs with
	# TRL 1.16 importable, as a user's environment with both has it (docs/troubleshooting.md, "verl next to TRL").
	$(BIN)/python -m pip install --quiet -e ".[test,dev,trl]"
	# OpenRLHF, for tests/openrlhf/test_trainer.py and tests/e2e: its wheel pins CUDA-only packages (flash-attn,
	# vllm), so it goes in without dependencies; deepspeed, which its trainer imports, is an sdist
	# built against the torch above (no ops are compiled).
	$(BIN)/python -m pip install --quiet setuptools wheel
	$(BIN)/python -m pip install --quiet --no-build-isolation deepspeed==0.19.6
	$(BIN)/python -m pip install --quiet --no-deps openrlhf==0.11.2
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .

# Two pytest-xdist workers: whole files each (the e2e modules share their runs through module fixtures), and
# the files that launch trainers one after another on one worker (tests/conftest.py); TEST_WORKERS=0 runs in
# one process.
TEST_WORKERS ?= 2

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The framework-free core's tests (tests/core) in well under a minute: torch and numpy only. Those that
# compare with verl's own code are marked `verl` and left to `make test`; AVSPO_CORE_ONLY=1 makes an
# import of verl, Ray, OpenRLHF, DeepSpeed, Hydra or OmegaConf fail (tests/core/conftest.py), and
# Hydra's pytest plugin, which imports both, is off.
test-core: $(STAMP)
	AVSPO_CORE_ONLY=1 $(BIN)/python -m pytest -q -p no:hydra_pytest -m "not verl" tests/core

# verl's and OpenRLHF's own PPO trainers end to end on CPU, a tiny random Qwen2 per run (tests/e2e; part of
# `make test` too).
e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

# The CPU sandbox: GRPO vs AVSPO on a tiny LM (summary.md and plots in runs/sandbox). runs/sandbox is the demo's
# own folder, so a second `make demo` replaces the first (--force); `verl-avspo sandbox` alone refuses to.
demo: $(STAMP)
	$(BIN)/verl-avspo sandbox --out runs/sandbox --force

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_advantage.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache runs
