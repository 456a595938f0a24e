# Two commands do all set-up on a fresh machine:
#   make run    the product on embedded defaults (SQLite, local files, filesystem broker) plus a local vLLM
#   make test   the whole suite
#   make docs   the documentation site (mkdocs.yml, docs/) into site/
#   make figures  re-measure every figure the docs quote (scripts/figures.sh)
#   make compose-test  build the images, start docker-compose.yml under podman, walk it
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast install vllm lint bench figures migrate demo clean docs compose-test

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

install: $(STAMP)

vllm:
	bash scripts/vllm/install.sh

run: install
	bash scripts/run.sh

test: install
	bash scripts/test.sh

# The compose tier alone (scripts/test.sh runs it too): docs/operators/deployment.md.
compose-test: install
	bash scripts/compose/test.sh

test-fast: install
	$(BIN)/pytest -m "not vllm and not browser and not faults and not contract and not bench and not conformance and not compose" -q

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: install
	$(BIN)/python -m bench.upload_throughput

# Re-run every bench (full mode) and the fault tier; rewrite the figure blocks
# of README.md and docs/figures.md from their output (long: most of an hour).
figures: install
	bash scripts/figures.sh

clean:
	rm -rf var .pytest_cache site
