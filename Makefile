# Two set-up commands: `make demo` (the main job on the embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0

.PHONY: install install-dev demo quick test lint slow-test

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first and pinned (a CPU build), only when no torch is importable.
install: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e .

install-dev: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev]'

demo: install
	$(BIN)/specmoe plan --out out/demo

# the whole path in minutes: benchmark, plan, quick runs, validate, HTML report (out/quick)
quick: install
	PYTHON=$(BIN)/python bash scripts/quick_e2e.sh out/quick

test: install-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2

slow-test: install-dev
	$(BIN)/python -m pytest -m slow

lint: install-dev
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
