# stepagent — developer entry points. Everything installs into .venv from this repository's own files.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup run test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

## run: chat with an agent on the embedded local stack (pass ARGS="--say hello" for non-interactive use)
run: setup
	$(VENV)/bin/stepagent run $(ARGS)

## test: the whole suite (what CI runs)
test: setup
	$(PY) -m pytest

## lint: ruff + mypy strict on src/
lint: setup
	$(VENV)/bin/ruff check src tests handlers
	$(VENV)/bin/ruff format --check src tests handlers
	$(VENV)/bin/mypy

## bench: benchmarks, results in docs/benchmarks.json (not part of make test)
bench: setup
	$(PY) -m stepagent.bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info
