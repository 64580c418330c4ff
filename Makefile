# stepagent — developer entry points. Everything installs into .venv from this repository's own files.
# The deployed Lambda runtime is python3.13 (template.yaml): develop and test on it where this machine has it
# (pyenv's 3.13, else a python3.13 on PATH), else on python3. The oldest version requires-python claims
# (3.11) has its own lane in make test (test-oldest).
PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) \
	$(shell python3.13 -c 'import sys; print(sys.executable)' 2>/dev/null) python3)
OLDEST_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.11*/bin/python3.11) \
	$(shell python3.11 -c 'import sys; print(sys.executable)' 2>/dev/null))
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SAM_VENV := .venv-sam
SAM := $(SAM_VENV)/bin/sam
SAM_STAMP := $(SAM_VENV)/.installed

PEER_VENV := .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed

.PHONY: setup run test test-fast test-oldest lint lint-template bench coverage deploy clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@echo "setup: installing stepagent and its pinned development dependencies into $(VENV) on $$($(PYTHON) -V) (2-4 minutes the first time)"
	@# A venv left from another interpreter (an earlier 3.11 checkout) is rebuilt, not reused.
	@test -x $(PY) && [ "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" = "$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])')" ] \
		|| { rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,local]'
	@touch $(STAMP)
	@echo "setup: done"

## run: chat with an agent on the embedded local stack (pass ARGS="--say hello" for non-interactive use)
run: setup
	$(VENV)/bin/stepagent run $(ARGS)

## test: lint, template checks, the whole suite on the deployed Python and the fast lane on the oldest
## Python requires-python claims (what CI runs)
test: setup lint lint-template
	$(PY) -m pytest
	$(MAKE) --no-print-directory test-oldest

## test-fast: the in-process lane while you work (a few minutes, not a substitute for make test): ruff, then
## unit, engine, the store contract on the in-memory stores, providers, RAP, MCP and local mode; no moto
## server, no subprocess stack, no browser, no template checks
FAST_TESTS := tests/unit tests/engine tests/contract tests/providers tests/rap tests/mcp tests/local tests/test_public_api.py
test-fast: setup
	$(VENV)/bin/ruff check src tests handlers examples bench
	$(PY) -m pytest $(FAST_TESTS) -m "not slow" -k "not dynamodb and not moto"

## test-oldest: the fast lane on $(OLDEST_PYTHON), the oldest version requires-python claims, in its own
## $(OLDEST_VENV); skipped with a notice on a machine without that Python
OLDEST_VENV := .venv-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.installed
test-oldest:
	@if [ -z "$(OLDEST_PYTHON)" ]; then \
		echo "test-oldest: SKIPPED - no python3.11 on this machine (requires-python claims >=3.11; install it, e.g. pyenv install 3.11, to test it)"; \
	else \
		$(MAKE) --no-print-directory $(OLDEST_STAMP) && \
		$(OLDEST_VENV)/bin/python -m pytest $(FAST_TESTS) -m "not slow" -k "not dynamodb and not moto" -q; \
	fi

$(OLDEST_STAMP): pyproject.toml constraints.txt
	@echo "setup: installing stepagent into $(OLDEST_VENV) on $$($(OLDEST_PYTHON) -V) (the oldest supported Python)"
	@test -x $(OLDEST_VENV)/bin/python || $(OLDEST_PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q -c constraints.txt -e '.[dev,local]'
	@touch $(OLDEST_STAMP)

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
	@echo "setup: installing SAM CLI into its own $(SAM_VENV) (about a minute the first time)"
	@test -x $(SAM_VENV)/bin/python || $(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install -q -c infra/sam-constraints.txt aws-sam-cli
	@touch $(SAM_STAMP)

## deploy: build the layer (stepagent + your TOOLS_DIR) and deploy with SAM; the first run asks for the
## parameters and saves them in samconfig.toml. make deploy [TOOLS_DIR=../myapp] [ARCHITECTURE=arm64]
STACK ?= stepagent
GUIDED = $(if $(shell grep -s parameter_overrides samconfig.toml),,--guided)
deploy: $(SAM_STAMP)
	@echo "deploy [1/3] sam build: the layer for $(ARCHITECTURE)$(if $(TOOLS_DIR), with the tools project $(TOOLS_DIR)) (about a minute; pip downloads Lambda wheels)"
	ARCHITECTURE="$(ARCHITECTURE)" TOOLS_DIR="$(TOOLS_DIR)" LAYER_AWS_SERVICES="$(LAYER_AWS_SERVICES)" \
		SAM_CLI_TELEMETRY=0 $(SAM) build
	@echo "deploy [2/3] sam deploy$(if $(GUIDED), --guided: first deploy - answer the questions (saved in samconfig.toml))"
	SAM_CLI_TELEMETRY=0 $(SAM) deploy $(GUIDED)
	@echo "deploy [3/3] the stack's outputs (stepagent send/history --stack $(STACK) read them)"
	SAM_CLI_TELEMETRY=0 $(SAM) list stack-outputs --stack-name $(STACK) --output table

# Called by `sam build` for RuntimeLayer (BuildMethod: makefile; samconfig.toml builds in source, so
# nothing is copied first): stepagent, its pinned dependencies and your tools project (TOOLS_DIR) as Lambda
# wheels for ARCHITECTURE, so no container is needed. See infra/build_layer.py.
ARCHITECTURE ?= x86_64
TOOLS_DIR ?=
LAYER_AWS_SERVICES ?=
build-RuntimeLayer:
	$(PYTHON) infra/build_layer.py --artifacts-dir "$(ARTIFACTS_DIR)" --architecture "$(ARCHITECTURE)" \
		--tools "$(TOOLS_DIR)" --aws-services "$(LAYER_AWS_SERVICES)"

## bench: benchmarks, results in docs/benchmarks.json (not part of make test); the peer frameworks run in
## their own $(PEER_VENV)
bench: setup $(PEER_STAMP)
	$(PY) -m bench

$(PEER_STAMP): bench/peer-requirements.txt
	@echo "setup: installing the benchmark peers (LangGraph, Strands) into their own $(PEER_VENV) (about a minute the first time)"
	@test -x $(PEER_VENV)/bin/python || $(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install -q -r bench/peer-requirements.txt
	@touch $(PEER_STAMP)

## coverage: the whole suite with a line-coverage report of src/stepagent (missing lines per file)
coverage: setup
	$(PY) -m pytest --cov=stepagent --cov-report=term-missing:skip-covered

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(SAM_VENV) $(PEER_VENV) .aws-sam .pytest_cache .mypy_cache .ruff_cache build src/*.egg-info

## soak: the long reliability runs, not part of make test (see docs/reliability.md): 1,000 crash runs
## through the worker on moto, 10,000 in memory with a fresh seed, 50 threads x 20 steps of load
## corpus: record a release's corpus (threads left at every waiting point, as stored and queued) from a
## checkout of CORPUS_FROM (a commit or tag; default HEAD) into tests/corpus/$(RELEASE); run it for each
## release before changing a format: make corpus RELEASE=r2 [CORPUS_FROM=v0.2.0]
CORPUS_FROM ?= HEAD
.PHONY: corpus
corpus: setup
	@test -n "$(RELEASE)" || { echo "corpus: name the release: make corpus RELEASE=<name> [CORPUS_FROM=<commit>]"; exit 2; }
	@tmp=$$(mktemp -d) && git worktree add -q --detach $$tmp/release $(CORPUS_FROM) && \
		echo "corpus: recording $$(git -C $$tmp/release rev-parse --short HEAD) into tests/corpus/$(RELEASE)" && \
		PYTHONPATH=$$tmp/release/src $(PY) -m tests.corpus.record tests/corpus/$(RELEASE); status=$$?; \
		git worktree remove --force $$tmp/release; rm -rf $$tmp; exit $$status

.PHONY: soak
soak: setup
	@seed=$${STEPAGENT_CRASH_SEED:-$$(date +%s)}; echo "soak: STEPAGENT_CRASH_SEED=$$seed"; \
		STEPAGENT_SOAK=1 STEPAGENT_MOTO_CRASH_RUNS=1000 STEPAGENT_CRASH_RUNS=10000 STEPAGENT_CRASH_SEED=$$seed \
		$(PY) -m pytest tests/reliability -q
