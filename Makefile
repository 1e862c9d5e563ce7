# Two entry points: `make demo` (set up, then run the main job) and `make test` (set up, then test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/attnlab lesson

lint: setup
	$(BIN)/ruff check src tests benchmarks

test: lint
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
