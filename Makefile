# Rhumbatron — every command creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## The main job on the embedded default (nats-server + moto S3 on loopback, local SQLite).
demo: $(STAMP)
	$(BIN)/python -m rhumbatron.demo

## Lint (ruff + mypy over the package), then the whole test suite.
test: lint
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check shared functions tests bench
	$(BIN)/mypy
	$(BIN)/cfn-lint template.yaml

# The benchmarks also need the `bench` extra (FastStream, the router's peer); `make test` does not.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

## Benchmarks: prints a table and writes bench/results.json.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

clean:
	rm -rf .rhumbatron .pytest_cache .mypy_cache .ruff_cache
