# Two entry points on a fresh machine with python3 >= 3.11: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip

.PHONY: demo test test-fast lint bench clean clean-cache

# Core + analysis extras: what the main job needs.
$(VENV)/.core: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[analysis]"
	touch $@

# Everything the suite and the lint exercise: the test and docs extras and the GPU side, gpu/ (its own distribution,
# simfloat-emu-gpu: torch, CPU wheel, pinned, and triton included), both editable.
$(VENV)/.full: $(VENV)/.core gpu/pyproject.toml
	$(PIP) install -q -c constraints.txt -e ".[analysis,test,docs]" -e ./gpu
	touch $@

demo: $(VENV)/.core
	$(BIN)/simfloat attribute

# The test files are spread over one worker process per core (pytest-xdist; a file's tests stay in one worker,
# the workers share numba's on-disk cache); WORKERS=0 runs everything in one process.
# The 30 slowest tests are listed at the end (--durations): where the suite's time goes.
WORKERS ?= auto
# The docs' pages (tests/packaging/test_docs.py, each page a fresh process) run last, on the kernels the suite compiled
# into numba's cache: beside the suite they would compile the same kernels again, in parallel.
# The generic-CPU check (tests/core/test_cpu_target.py: one cold compile of every engine, minutes of one core) runs
# in a process of its own beside the suite from the start, not at the tail of one worker while the other idles.
CPU_TARGET := tests/core/test_cpu_target.py
test: $(VENV)/.full
	@$(BIN)/python -m pytest -q -p no:cacheprovider $(CPU_TARGET) > $(VENV)/cpu-target.log 2>&1 & check=$$!; \
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --durations=30 --ignore=tests/packaging/test_docs.py \
		--ignore=$(CPU_TARGET); suite=$$?; \
	wait $$check; target=$$?; echo "$(CPU_TARGET), beside the suite:"; cat $(VENV)/cpu-target.log; \
	test $$suite -eq 0 && test $$target -eq 0
	$(BIN)/python -m pytest -q -n $(WORKERS) tests/packaging/test_docs.py

test-fast: $(VENV)/.full
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile -m "not slow"

# The docs site builds with --strict: a broken link, anchor or API docstring fails the lint (the Python blocks of the
# pages run in the suite, tests/packaging/test_docs.py). Not --quiet: it hides the warnings that --strict counts.
lint: $(VENV)/.full
	$(BIN)/ruff check simfloat gpu/simfloat_gpu tests experiments benchmarks mkdocs_hooks.py
	$(BIN)/ruff format --check simfloat gpu/simfloat_gpu tests experiments benchmarks mkdocs_hooks.py
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(VENV)/site

bench: $(VENV)/.full
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_round.py

clean:
	rm -rf $(VENV)

# numba caches a function by its own source file only: stale after an edit of a helper it inlines.
clean-cache:
	find simfloat gpu tests experiments benchmarks -name '*.nbi' -delete -o -name '*.nbc' -delete
