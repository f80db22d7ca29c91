# Two commands on a fresh machine: `make run` (serve with embedded defaults) and
# `make test`. Both build .venv first if it is missing or out of date: `make run` with
# the runtime dependencies only, `make test` adds the dev tools.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
DATA_DIR ?= ./data
# Extra pip arguments for torch. Elsewhere than on these machines (whose pip finds a
# local CPU wheel), `make install TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"`
# avoids the multi-GB CUDA build.
TORCH_PIP_ARGS ?=
# Optional extras on top of the runtime set, each pinned in requirements/EXTRA.txt:
# `make install EXTRAS=milvus` (or `make run EXTRAS=milvus`) for NORMCAL_STORAGE=milvus.
# `make test` needs none: the dev lock includes them.
EXTRAS ?=
# The real Milvus engine (milvus-lite 2.5.1's C++ server) that the Milvus tests also
# run on, in its own environment: its import name is that of the milvus-lite 3.x in
# .venv. `make test` builds it; tests/support/milvus_engine.py finds it here.
ENGINE_VENV ?= .venv-milvus-engine

# pytest-xdist worker processes for `make test` and `make test-fast`: `auto` is one per
# core; TEST_WORKERS=0 runs the suite in this process. Each test file runs whole on one
# worker (--dist loadfile), so a module's fixtures (a served process, a fitted
# calibrator) are set up once (docs/development.md: Tests in parallel), and servers fork
# from a pre-imported interpreter (tests/support/zygote.py). Measured on a quiet 2-core
# machine, clean clone, first run after building the venvs (2026-12-06): `make test`
# 2,239 tests in 8.7 min (11.0 min with the builds; coverage's tracer costs ~2/3 more
# CPU in-process), `make test-fast` 1,821 in 2.2 min.
TEST_WORKERS ?= auto
# Files start longest first (tests/file_seconds.json, `make test-seconds`), not in
# xdist's order by number of tests.
XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: install install-dev lock run test test-fast test-seconds lint fmt bench clean

# The pins every install uses (refresh: `make lock`).
RUNTIME_LOCK := requirements/runtime.txt
DEV_LOCK := requirements/dev.txt

# `make run` needs only the runtime set (and EXTRAS); test/lint/fmt add the dev tools.
install: $(VENV)/.installed $(foreach e,$(EXTRAS),$(VENV)/.installed-$(e))
install-dev: $(VENV)/.installed-dev

# torch is installed first and pinned: an unpinned resolve would pull a multi-GB CUDA
# build. Then the locked runtime set, then the Python client (its own distribution,
# not on PyPI, that the server depends on) and the project itself, neither resolving
# again.
$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml $(RUNTIME_LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -r $(RUNTIME_LOCK)
	$(BIN)/pip install --no-deps -e clients/python
	$(BIN)/pip install --no-deps -e .
	$(BIN)/pip check
	touch $@

# One extra's pins, installed over the runtime set (the lock keeps them compatible).
$(VENV)/.installed-%: $(VENV)/.installed requirements/%.txt
	$(BIN)/pip install -r requirements/$*.txt
	$(BIN)/pip check
	touch $@

$(ENGINE_VENV)/.installed: requirements/milvus-engine.txt
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install -r requirements/milvus-engine.txt
	$(ENGINE_VENV)/bin/pip check
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(DEV_LOCK)
	$(BIN)/pip install -r $(DEV_LOCK)
	$(BIN)/pip check
	touch $@

# Re-resolve pyproject.toml's ranges into the two lock files (see scripts/lock.sh).
lock:
	PYTHON=$(PYTHON) TORCH_VERSION=$(TORCH_VERSION) TORCH_PIP_ARGS="$(TORCH_PIP_ARGS)" scripts/lock.sh

run: install
	HF_HUB_OFFLINE=1 $(BIN)/normcal serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

# Everything (CI runs this). Tests that read ../shared/data (or $$NORMCAL_SHARED_DATA)
# skip when it is absent. Coverage of app, calibration and normcal_client, measured in
# the pytest process (not in the `normcal serve` subprocesses), fails under the floor in
# pyproject.toml ([tool.coverage.report] fail_under). The Milvus tests run on Milvus
# Lite 3.x (.venv) and on the real engine ($(ENGINE_VENV)).
test: install-dev $(ENGINE_VENV)/.installed
	HF_HUB_OFFLINE=1 NORMCAL_TEST_MILVUS_ENGINE=$(ENGINE_VENV) $(BIN)/python -m pytest $(XDIST) --cov --cov-report=term --durations=15

# The edit-test loop (2.2 min on 2 cores, measured as above):
# everything but the tests marked slow (a server or another Python process started,
# durability, concurrency, real-data runs, the fresh-venv install, Milvus beyond a
# smoke set); every module still runs.
test-fast: install-dev
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest $(XDIST) -m "not slow"

# Measure each test file's seconds in a whole run into tests/file_seconds.json, the
# order `make test` starts files in (a file not in it counts a second a test).
test-seconds: install-dev $(ENGINE_VENV)/.installed
	HF_HUB_OFFLINE=1 NORMCAL_TEST_MILVUS_ENGINE=$(ENGINE_VENV) NORMCAL_TEST_SECONDS_OUT=tests/file_seconds.json $(BIN)/python -m pytest $(XDIST)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

fmt: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install-dev
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/ingest.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/calibration_synthetic.py

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .pytest_cache .mypy_cache .ruff_cache
