# The two commands of the README: `make run` (set up, then the main job) and `make test`.
PY ?= python3

.PHONY: setup run test lint bench

# torch first, and only if missing: installing attnlab must never replace the torch you have.
setup:
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"

run: setup
	$(PY) -m attnlab run knowledge

lint:
	$(PY) -m ruff check .

test: setup lint
	$(PY) -m pytest

bench: setup
	$(PY) benchmarks/bench_gpt.py
