# `make run` and `make test` work on a fresh machine: the first use creates .venv and installs
# the project (with the recipes' and tests' extras); later uses reuse it until pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test
run: $(STAMP)
	$(VENV)/bin/temper run recipes/digits-cnn.yaml

# Lint (ruff, configured in pyproject.toml), then the whole suite, slow MiniLM tests included
# (target: 15 minutes on 2 cores); plain `pytest` skips those. It prints the 15 slowest tests and
# the peak RSS (tests/conftest.py; /usr/bin/time is not on a fresh Debian).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -m "slow or not slow" --durations=15

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)
