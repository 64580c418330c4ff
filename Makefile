# stepagent — developer entry points. Everything installs into .venv from this repository's own files.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SAM_VENV := .venv-sam
SAM := $(SAM_VENV)/bin/sam
SAM_STAMP := $(SAM_VENV)/.installed

.PHONY: setup run test lint lint-template bench deploy clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,local]'
	@touch $(STAMP)

## run: chat with an agent on the embedded local stack (pass ARGS="--say hello" for non-interactive use)
run: setup
	$(VENV)/bin/stepagent run $(ARGS)

## test: lint, template checks and the whole suite (what CI runs)
test: setup lint lint-template
	$(PY) -m pytest

## lint: ruff + mypy strict on src/ and bench/ + the import layering contracts (import-linter)
lint: setup
	$(VENV)/bin/ruff check src tests handlers examples bench
	$(VENV)/bin/ruff format --check src tests handlers examples bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

## lint-template: cfn-lint and `sam validate --lint` on template.yaml (SAM CLI lives in its own venv)
lint-template: setup $(SAM_STAMP)
	$(VENV)/bin/cfn-lint template.yaml
	AWS_DEFAULT_REGION=us-east-1 SAM_CLI_TELEMETRY=0 $(SAM) validate --lint --template template.yaml

$(SAM_STAMP): infra/sam-constraints.txt
	@test -x $(SAM_VENV)/bin/python || $(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install -q -c infra/sam-constraints.txt aws-sam-cli
	@touch $(SAM_STAMP)

## deploy: build (no container needed) and deploy with SAM, asking for parameters the first time
deploy: $(SAM_STAMP)
	SAM_CLI_TELEMETRY=0 $(SAM) build
	SAM_CLI_TELEMETRY=0 $(SAM) deploy --guided

# Called by `sam build` for RuntimeLayer (BuildMethod: makefile): the package and its pinned
# dependencies, as Lambda (manylinux, CPython 3.11) wheels, so no container is needed; the .pyc files
# are kept because compiling at cold start is billed.
build-RuntimeLayer:
	rm -rf "$(ARTIFACTS_DIR)/wheel" && $(PYTHON) -m pip wheel -q --no-deps -w "$(ARTIFACTS_DIR)/wheel" .
	$(PYTHON) -m pip install -q --target "$(ARTIFACTS_DIR)/python" -c constraints.txt \
		--platform manylinux2014_x86_64 --implementation cp --python-version 3.11 --only-binary=:all: \
		"$(ARTIFACTS_DIR)"/wheel/*.whl
	rm -rf "$(ARTIFACTS_DIR)/wheel"

## bench: benchmarks, results in docs/benchmarks.json (not part of make test)
bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(SAM_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info

## soak: the long reliability runs, not part of make test (see docs/reliability.md): 1,000 crash runs
## through the worker on moto, 10,000 in memory with a fresh seed, 50 threads x 20 steps of load
.PHONY: soak
soak: setup
	@seed=$${STEPAGENT_CRASH_SEED:-$$(date +%s)}; echo "soak: STEPAGENT_CRASH_SEED=$$seed"; \
		STEPAGENT_SOAK=1 STEPAGENT_MOTO_CRASH_RUNS=1000 STEPAGENT_CRASH_RUNS=10000 STEPAGENT_CRASH_SEED=$$seed \
		$(PY) -m pytest tests/reliability -q
