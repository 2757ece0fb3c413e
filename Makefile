# Everything sets up its own environment in .venv on first use.
# torch: TORCH defaults to the CPU build, never a multi-GB CUDA one by accident: PyTorch's CPU index is added, and
# its torch==2.13.0+cpu outranks PyPI's CUDA build of 2.13.0 (where that index cannot be reached, pip retries each
# package for a few seconds, about a minute in all, then takes the wheels from its other sources). On a GPU machine
# pass e.g.
# TORCH="torch --index-url https://download.pytorch.org/whl/cu124".
PYTHON ?= python3
TORCH ?= torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast test-oldest gpu-check lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[dev]"  # dev = the [train] and [hub] extras + the test tools
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m ode_transformer.train.demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=15  # and the 15 slowest tests

# The oldest versions pyproject allows (.ci/oldest-constraints.txt, which tests/test_packaging.py ties to the
# floors in pyproject), in a venv of their own; `make test` runs on the newest releases.
OLDEST := .venv-oldest
$(OLDEST)/.installed: pyproject.toml .ci/oldest-constraints.txt
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --upgrade pip
	$(OLDEST)/bin/pip install -q $(TORCH)
	$(OLDEST)/bin/pip install -q -e ".[dev]" -c .ci/oldest-constraints.txt
	touch $@

test-oldest: $(OLDEST)/.installed
	$(OLDEST)/bin/python -m pytest -n 2 --dist loadgroup

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 -m "not slow"

# On a GPU machine: the tests in fp32 and bf16, the MarianMT benchmark, one short paper-size run per study, all
# in benchmarks/results/gpu-<time stamp>/ (benchmarks/gpu_suite.py); `make gpu-check ARGS=--dry-run` prints the plan.
gpu-check: $(STAMP)
	$(BIN)/python -m benchmarks.gpu_suite $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(OLDEST) .cache .pytest_cache .ruff_cache
