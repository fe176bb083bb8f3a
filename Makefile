# millstream: `make demo` runs the main job, `make test` runs lint, types and the test suite.
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# pytest workers for `make test` (pytest-xdist; 0 runs in one process). The suite waits on
# brokers and pipeline start-ups more than it computes: two workers share two cores well.
TEST_WORKERS ?= 2
DURATION ?= 600
BENCH_ARGS ?=

.PHONY: help setup demo test lint typecheck unit bench chaos clean

help: ## Show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

setup: ## Create the virtualenv and install everything (run by demo and test)
	@bash scripts/bootstrap.sh

demo: setup ## Run the Zeitgeist demo pipeline on embedded (or your) Redis and Kafka
	$(BIN)/millstream demo

lint: setup ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup ## mypy on the package, laid out as installed (see scripts/typecheck.py)
	$(BIN)/python scripts/typecheck.py

test: setup lint typecheck ## Lint, type check and the full pytest suite
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

unit: setup ## Only the fast unit tests
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

bench: setup ## Run `millstream bench` (BENCH_ARGS="--quick" for a smoke run); results in benchmarks/results/latest
	$(BIN)/millstream bench $(BENCH_ARGS)

chaos: setup ## Soak: a counter under random real faults for DURATION seconds (default 600), verified by id
	$(BIN)/millstream chaos --duration $(DURATION)

clean: ## Remove the virtualenv and local state
	rm -rf $(VENV) .millstream build *.egg-info
