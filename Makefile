PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-crash lint demo bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Tests run in TEST_WORKERS processes (pytest-xdist), each test file whole in
# one of them: most of a test's time is spent waiting on the processes it
# starts, so three workers keep a 2-CPU machine busy. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

# Everything: the fast layer plus the long sweeps and the 1000-kill torture run.
test-crash: $(STAMP)
	$(BIN)/pytest -q -o addopts= -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check statequeue tests scripts
	$(BIN)/ruff format --check statequeue tests scripts
	$(BIN)/mypy
	$(BIN)/python scripts/check_layers.py  # core <- stats <- store <- api <- run <- cli

# The demo needs the package only, not the dev tools (`make test` adds those).
DEMO_STAMP := $(VENV)/.installed-package

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

# The peers persist-queue and litequeue live in the bench environment only;
# psycopg (the postgres extra) for the PostgreSQL figures, procrastinate as their peer,
# pytest for the throwaway-cluster helper bench_pg.py shares with the tests (tests/pg.py).
$(BENCH_STAMP): pyproject.toml
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --upgrade pip
	$(BENCH_VENV)/bin/pip install -q -e '.[postgres]' persist-queue litequeue 'procrastinate==3.10.*' pytest
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m compileall -q statequeue  # as an installed package would be
	$(BENCH_VENV)/bin/python scripts/bench.py $(BENCH_ARGS)
	@if command -v strace >/dev/null 2>&1; then \
		$(BENCH_VENV)/bin/python scripts/strace_items.py --shapes per-item,persistent,serve,work,floor \
			$(filter --quick,$(BENCH_ARGS)); \
	else echo "strace is not installed: scripts/strace_items.py (system calls per item) skipped"; fi
	$(BENCH_VENV)/bin/python scripts/bench_pg_ops.py $(if $(findstring --quick,$(BENCH_ARGS)),--quick)
	$(BENCH_VENV)/bin/python scripts/bench_transfer.py
	$(BENCH_VENV)/bin/python scripts/bench_library.py
	$(BENCH_VENV)/bin/python scripts/bench_persistent.py $(filter --quick,$(BENCH_ARGS))
	$(BENCH_VENV)/bin/python scripts/bench_compaction.py $(filter --quick,$(BENCH_ARGS))
	$(BENCH_VENV)/bin/python scripts/bench_stats.py --json bench-results-stats.json
	$(BENCH_VENV)/bin/python scripts/bench_report.py $(if $(findstring --quick,$(BENCH_ARGS)),--items 100000 --rounds 1)
	$(BENCH_VENV)/bin/python scripts/bench_pg.py $(filter --quick,$(BENCH_ARGS))
	$(BENCH_VENV)/bin/python scripts/bench_rate.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache
