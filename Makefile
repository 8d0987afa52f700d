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

test: $(STAMP)
	$(BIN)/pytest -q

test-crash: $(STAMP)
	$(BIN)/pytest -q -m crash

lint: $(STAMP)
	$(BIN)/ruff check statequeue tests scripts
	$(BIN)/ruff format --check statequeue tests scripts
	$(BIN)/mypy

demo: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/demo.sh

bench: $(STAMP)
	$(BIN)/python scripts/bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
