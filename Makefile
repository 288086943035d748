# The two set-up-and-run commands of the README.
.PHONY: setup demo test test-fast bench bench-smoke

setup:
	bash scripts/setup.sh

demo: setup
	.venv/bin/dwb demo

test: setup
	bash scripts/setup-test-deps.sh
	bash scripts/setup-reference-packages.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=25

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow"

# Every benchmark's CPU figures, one after the other, each into bench/out/NAME.json (BENCHMARKS.md has the
# commands). GPU figures: `--gpu` (app_overhead, evaluate_bench), train_throughput without --reduced; all of them
# in one run of at most 8 minutes: bench/device_check.py (BENCHMARKS.md, "The one-shot GPU check").
bench: setup
	.venv/bin/python bench/composer_overhead.py
	.venv/bin/python bench/streaming_throughput.py
	.venv/bin/python bench/precompute_speedup.py
	.venv/bin/python bench/train_throughput.py --reduced
	.venv/bin/python bench/human_eval_latency.py
	.venv/bin/python bench/app_overhead.py
	.venv/bin/python bench/evaluate_bench.py
	.venv/bin/python bench/convert_throughput.py
	.venv/bin/python bench/convert_aspect.py
	.venv/bin/python bench/bucket_throughput.py
	.venv/bin/python bench/family_memory.py
	.venv/bin/python bench/sharded_checkpoints.py

# Every benchmark for seconds on the tiny model (--smoke): it runs, and its own equality checks hold.
bench-smoke: setup
	.venv/bin/python -m pytest tests/test_bench.py -q
