# Veracity developer loop. `make help` lists the targets.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export VERACITY_APP ?= veracity.examples.shop:app

.PHONY: help install run test lint bench bench-peers mutation soak clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is needed" if sys.version_info < (3, 11) else 0)'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv (installed into the venv by pip) resolves and installs in a fraction of pip's time;
	# where it cannot be had or fails, pip does it as before
	( $(BIN)/python -m pip install --quiet uv && \
	  $(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[dev]' ) || \
	( $(BIN)/python -m pip install --quiet --upgrade pip && \
	  $(BIN)/python -m pip install --quiet -e '.[dev]' )
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install Veracity with its development tools

run: $(STAMP) ## Run the server on ./veracity.db with the example app (VERACITY_* apply)
	$(BIN)/veracity migrate
	$(BIN)/veracity server

lint: $(STAMP) ## ruff and mypy --strict
	$(BIN)/ruff check src tests bench tools examples
	$(BIN)/mypy

# The tests start hundreds of veracity processes: they must find Veracity's modules compiled,
# so PYTHONDONTWRITEBYTECODE (set on some CI machines) is cleared for them (an empty value is
# "not set" to Python). Two pytest processes per core: most of a test's time is spent
# waiting (on PostgreSQL, on the processes it started, on a lease to expire), so the cores
# stay busy; more would starve the worker processes the tests start, whose leases last 1.5 s
# (README: Tests). The benchmarks clear it too: they time processes as an installed system
# runs them, with bytecode cached (bench/journal.md).
TEST_PROCESSES ?= $(shell $(PYTHON) -c 'import os; print(max(2, 2 * len(os.sched_getaffinity(0))))')
# mypy (about 25 s of one core from a fresh clone) runs beside the tests, at a lower priority
# than theirs, its output shown after theirs; the target fails if either fails.
test: $(STAMP) ## Lint, and the whole test suite on 2 processes per core (needs PostgreSQL; see README)
	$(BIN)/ruff check src tests bench tools examples
	@typed=$$(mktemp); nice -n 10 $(BIN)/mypy >"$$typed" 2>&1 & mypy=$$!; \
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -n $(TEST_PROCESSES); tests=$$?; \
	wait $$mypy; mypy_status=$$?; echo "mypy:"; cat "$$typed"; rm -f "$$typed"; \
	test $$tests -eq 0 && test $$mypy_status -eq 0

bench: $(STAMP) ## Benchmarks (not part of the tests); see bench/README.md
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m bench

PEERS := .venv-peers
$(PEERS)/.installed: pyproject.toml
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet -e . 'pgqueuer[asyncpg]==1.6.0' asyncpg==0.30.0 procrastinate==3.10.0 dbos==3.4.0
	touch $(PEERS)/.installed

bench-peers: $(PEERS)/.installed ## Veracity beside PGQueuer, Procrastinate, DBOS and a plain queue (own venv; bench/README.md)
	PYTHONDONTWRITEBYTECODE= nice $(PEERS)/bin/python -m bench.peers $(ARGS)

mutation: $(STAMP) ## Mutation testing of the core, recovery, locks, fenced writes, heartbeat (not part of the tests; ~1.5 h; see docs/testing.md)
	nice -n 10 $(BIN)/python tools/mutation.py $(MODULES)

SEED ?= 1
MINUTES ?= 10
soak: $(STAMP) ## The seeded fault soak and its invariant check (SEED=1 MINUTES=10; bench/README.md)
	$(BIN)/python -m bench.soak --seed $(SEED) --minutes $(MINUTES)

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) $(PEERS) .mypy_cache .ruff_cache .pytest_cache .mutation
