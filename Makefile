.PHONY: setup setup-test run test lint bench llama-server

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

run: setup
	.venv/bin/specledger run

# the live llama.cpp tests (tests/test_llama_server.py) need the binary: built once (about 6 minutes on
# 2 cores), built for this CPU (-march=native) and cached under ~/.cache/specledger/llama-server/<version>-<key>/
test: setup-test llama-server
	.venv/bin/python -m pytest -q
	.venv/bin/ruff check .

lint: setup-test
	.venv/bin/ruff check .

llama-server:
	scripts/build_llama_server.sh

bench: setup
	.venv/bin/python benchmarks/bench_engine.py
