.PHONY: setup setup-test run test lint bench

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

run: setup
	.venv/bin/specledger run

test: setup-test
	.venv/bin/python -m pytest -q
	.venv/bin/ruff check .

lint: setup-test
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python benchmarks/bench_engine.py
