# The two set-up commands: `make demo` runs the main job, `make test` runs the checks and the tests.
# Each sets up what it needs on a fresh machine (a .venv, the Python packages, the Kafka jars) and
# is idempotent. System prerequisites (Java 17+, Maven, PostgreSQL server binaries) are listed in
# README.md; `.ci/run` installs them with apt-get when it runs as root.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
export DS_ACCELERATOR ?= cpu
# Quiet pip and keep its downloads in the user cache, outside the work tree.
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install setup test lint typecheck pytest demo up down status bench reliability clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel

# Reinstall when the dependency list or the pinned versions change.
$(INSTALLED): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q -c constraints.txt -e '.[all,dev]'
	touch $@

install: $(INSTALLED)

setup: install
	$(BIN)/liveloop setup

lint: install
	$(BIN)/ruff check infra ingest distill learner serving liveloop tests
	$(BIN)/ruff format --check infra ingest distill learner serving liveloop tests

typecheck: install
	$(BIN)/mypy

# Two pytest workers: most of the suite waits on services rather than on the CPU. The tests that train a
# whole loop of their own run one after another on one worker (tests/conftest.py, WHOLE_LOOP).
TEST_WORKERS ?= 2

pytest: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: lint typecheck pytest

demo: setup
	$(BIN)/liveloop demo

up: setup
	$(BIN)/liveloop up

down: install
	$(BIN)/liveloop down

status: install
	$(BIN)/liveloop status

# The benchmarks write bench-results/*.json; the pages docs/benchmarks.md and docs/capacity.md are generated from them.
bench: setup
	$(BIN)/python -m pytest tests/bench -p no:randomly -q -s --override-ini addopts=; status=$$?; \
	$(BIN)/python -m tests.bench.page && $(BIN)/python -m tests.bench.capacity; exit $$status

# The reliability suite at full size (10 minutes of load, 10,000 fuzz requests per API, longer faults);
# `make test` runs the same tests in a shortened form. The report goes to reliability-report/.
reliability: setup
	rm -rf reliability-report
	LIVELOOP_RELIABILITY_FULL=1 $(BIN)/python -m pytest tests/reliability -p no:randomly -q -s

clean: down
	rm -rf .liveloop bench-results reliability-report
