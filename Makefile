# Two commands on a fresh machine: `make run` (serve with embedded defaults) and
# `make test`. Both build .venv first if it is missing or out of date.
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

.PHONY: install run test test-fast lint fmt bench clean

install: $(VENV)/.installed

# torch is installed first and pinned: an unpinned resolve would pull a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -e ".[dev]"
	touch $@

run: install
	HF_HUB_OFFLINE=1 $(BIN)/normcal serve --host $(HOST) --port $(PORT) --data-dir $(DATA_DIR)

# Everything (CI runs this). Tests that read ../shared/data (or $$NORMCAL_SHARED_DATA)
# skip when it is absent.
test: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest

# The edit-test loop: everything but the tests marked slow (subprocess servers,
# durability, concurrency, real-data fits, the fresh-venv install).
test-fast: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/ingest.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/calibration_synthetic.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
