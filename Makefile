# Two entry points: `make demo` (the default sweep and its report) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[cpu,dev,cluster,peer]"
	$(BIN)/python -m ipykernel install --sys-prefix --name mtplab --display-name "mtplab" >/dev/null
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/mtplab sweep --preset default --name demo --resume --workers 1
	$(BIN)/mtplab report results/demo

test: $(STAMP)
	$(BIN)/ruff check mtplab tests benchmarks notebooks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check mtplab tests benchmarks notebooks

clean:
	rm -rf $(VENV) .pytest_cache
