# The two set-up-and-run commands of the README.
.PHONY: setup demo test test-fast bench

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/dwb demo

test: setup
	bash scripts/setup-test-deps.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider --durations=25

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"

bench: setup
	.venv/bin/python bench/composer_overhead.py
	.venv/bin/python bench/streaming_throughput.py
