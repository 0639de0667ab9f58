# One-command set-up and run. `make run` seeds the demo store and runs the Memory
# Manager jobs through Dagster; `make test` installs and runs the test suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MEMORY_HOME ?= $(CURDIR)/.memory
export MEMORY_HOME
export LITELLM_LOCAL_MODEL_COST_MAP := True
export DAGSTER_HOME ?= $(MEMORY_HOME)/dagster

.PHONY: setup run ui test test-slow test-all lint bench-embed bench-store bench-trickle bench-writes \
	bench-inject bench-locomo bench-maintenance bench-cycle bench-partitions clean check-install constraints bench-startup docs \
	setup-local-llm test-local-llm bench-judge bench-load bench-locomo-cv bench-extraction bench-history bench-notes \
	bench-guarded bench-cold bench-bulk bench-memory bench-ranker

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# constraints.txt pins every package to the versions CI tests with (pyproject has ranges)
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

$(VENV)/.model: $(VENV)/.installed
	$(BIN)/memory-pipelines fetch-model
	touch $@

setup: $(VENV)/.model

# The local-llm extra (llama-cpp-python compiles llama.cpp; portable CPU flags)
$(VENV)/.local-llm: $(VENV)/.installed
	CMAKE_ARGS="$${CMAKE_ARGS:--DGGML_NATIVE=OFF}" $(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,local-llm]'
	touch $@

setup-local-llm: setup $(VENV)/.local-llm

run: setup
	$(BIN)/memory-pipelines demo --home $(MEMORY_HOME)

ui: setup
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/dagster dev -w workspace.yaml

# the documentation site at http://127.0.0.1:8000 (mkdocs.yml; `mkdocs build --strict` builds it)
docs: setup
	$(BIN)/mkdocs serve

# the same site built into site/ (strict: a broken link, anchor or page fails the build)
docs-build: setup
	$(BIN)/mkdocs build --strict

# the default suite (not the slow tests) on every core, in at most four worker processes
# (pytest-xdist; each worker imports the stack once): PYTEST_WORKERS=0 runs it in this one
PYTEST_WORKERS ?= auto
test: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses=4

test-slow: setup
	$(BIN)/python -m pytest -q -m slow; rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ]

test-all: test test-slow

# the packaging checks CI runs: wheel + sdist (twine check), the core wheel in a fresh venv
# running the README's Python example, [dagster] beside a project with its own assets/,
# resources/, jobs/, and the lowest and newest allowed lancedb/pylance, litellm, Dagster
check-install: setup
	$(BIN)/python scripts/check_install.py

# pin what CI installs to what this venv has (after changing a dependency and testing)
constraints: setup
	{ sed -n '1,3p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^memory-pipelines' | sort -f; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

bench-startup: setup
	$(BIN)/memory-pipelines bench startup

test-local-llm: setup-local-llm
	$(BIN)/python -m pytest -q -m local_llm

lint: setup
	$(BIN)/ruff check memory_pipelines assets resources sensors jobs tests

bench-embed: setup
	$(BIN)/memory-pipelines bench embed
bench-store: setup
	$(BIN)/memory-pipelines bench store
bench-trickle: setup
	$(BIN)/memory-pipelines bench trickle
bench-writes: setup
	$(BIN)/memory-pipelines bench writes
bench-inject: setup
	$(BIN)/memory-pipelines bench inject
bench-locomo: setup
	$(BIN)/memory-pipelines bench locomo --data ../shared/data/locomo/locomo_dev.json --k 5 10
bench-locomo-cv: setup
	$(BIN)/memory-pipelines bench locomo --data ../shared/data/locomo/locomo_dev.json --k 5 10 --cv
bench-ranker: setup
	$(BIN)/memory-pipelines bench ranker --data ../shared/data/locomo/locomo_dev.json --k 5 10
bench-extraction: setup
	$(BIN)/memory-pipelines bench extraction --data ../shared/data/locomo/locomo_dev.json
bench-maintenance: setup
	$(BIN)/memory-pipelines bench maintenance
bench-cycle: setup
	$(BIN)/memory-pipelines bench cycle
bench-partitions: setup
	$(BIN)/memory-pipelines bench partitions
bench-load: setup
	$(BIN)/memory-pipelines bench load
bench-history: setup
	$(BIN)/memory-pipelines bench history
bench-notes: setup
	$(BIN)/memory-pipelines bench notes
bench-guarded: setup
	$(BIN)/memory-pipelines bench guarded --writes 10000
bench-cold: setup
	$(BIN)/memory-pipelines bench cold
bench-bulk: setup
	$(BIN)/memory-pipelines bench bulk
bench-memory: setup
	$(BIN)/memory-pipelines bench memory
bench-judge: setup-local-llm
	$(BIN)/memory-pipelines bench judge --llm local

clean:
	rm -rf $(MEMORY_HOME)
