# Rhumbatron — every command creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench
MUTATION_STAMP := $(VENV)/.installed-mutation

.PHONY: venv demo up test lint sam-check bench soak mutation clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## The main job on the embedded default (nats-server + moto S3 on loopback, local SQLite), from
## the development package (shared/rhumbatron_dev, not in the Lambda layer).
demo: $(STAMP)
	$(BIN)/python -m rhumbatron_dev.demo

## The embedded stack, the operator API and a live dashboard on 127.0.0.1; Ctrl-C stops.
up: $(STAMP)
	$(BIN)/rhumbatron up

## Lint (ruff, mypy over both packages, the import-linter layering), then the whole test suite.
# The dashboard's browser test drives Debian's chromium; as root, install it when missing
# (not root: the test skips and says why).
test: lint sam-check
	@if ! command -v chromium >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y --no-install-recommends chromium; } \
		|| echo "chromium could not be installed: the dashboard's browser test will skip"; fi
	$(BIN)/pytest

## `sam validate --lint`, then `sam build` of every function and layer (cached: skipped while
## the template, samconfig.toml, functions/, layers/, shared/ and statemachines/ are as they
## were at the last good build). tests/lambda_/test_template_invoke.py then invokes the build.
# The SAM CLI gets its own venv: it pins exact versions of boto3, click and pydantic that
# would otherwise replace the project's own in .venv.
SAM_VENV        := $(VENV)/sam-cli
SAM             := SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam
SAM_STAMP       := $(SAM_VENV)/.installed
SAM_CHECK_STAMP := .aws-sam/sam-check.sha256
SAM_INPUTS      := template.yaml samconfig.toml functions layers shared statemachines

$(SAM_STAMP):
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install --quiet --upgrade pip
	$(SAM_VENV)/bin/pip install --quiet 'aws-sam-cli>=1.170,<2'
	touch $(SAM_STAMP)

sam-check: $(SAM_STAMP)
	@hash=$$(find $(SAM_INPUTS) -type f ! -path '*/__pycache__/*' ! -name '*.pyc' \
		! -path '*.egg-info/*' 2>/dev/null | LC_ALL=C sort | xargs sha256sum | sha256sum \
		| cut -c1-64); \
	if [ "$$(cat $(SAM_CHECK_STAMP) 2>/dev/null)" = "$$hash" ]; then \
		echo "sam-check: sources unchanged since the last sam validate and sam build"; \
	else \
		$(SAM) validate --lint && $(SAM) build && echo "$$hash" > $(SAM_CHECK_STAMP); \
	fi

lint: $(STAMP)
	$(BIN)/ruff check shared functions tests bench mutation
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/cfn-lint template.yaml infra/*.yaml

# The benchmarks also need the `bench` extra (FastStream, the router's peer); `make test` does not.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

## Benchmarks: prints a table and writes bench/results.json.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

## The soak (issue #17): a million events over four simulated days on the embedded stack;
## prints its figures with PASS or FAIL per check and target and writes bench/soak-results.json.
## `make soak EVENTS=100000` sends fewer (its checks count; the targets are a million's).
soak: $(STAMP)
	$(BIN)/python -m bench.soak $(if $(EVENTS),--events $(EVENTS))

# Mutation testing needs the `mutation` extra (mutmut), which dev also installs.
$(MUTATION_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,mutation]'
	touch $(MUTATION_STAMP)

## Mutation testing of the core (hours; not part of `make test`): prints the kill rate per
## package and writes mutation/results.json. `make mutation PKG=router` runs one package.
mutation: $(MUTATION_STAMP)
	$(BIN)/python -m mutation.run $(if $(PKG),--package $(PKG))

clean:
	rm -rf .mutation .rhumbatron .pytest_cache .mypy_cache .ruff_cache
