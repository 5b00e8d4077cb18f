# Two commands for a fresh machine: `make demo` (the main job on the embedded default) and `make test`.
# Both create .venv and install everything: torch is pinned and installed *before* the project so that
# no resolver pulls a multi-GB CUDA build.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -q -e ".[dev,ray,scienceworld,textworld,skyrl]"
	@# Debian's chromium for the report.html browser test (Playwright cannot fetch its own); never fatal
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; } || true; }
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/dreamgym demo $(DEMO_ARGS)

# Test files run on TEST_WORKERS processes (pytest-xdist; a file's tests stay together, so module fixtures are
# built once), each torch on one thread (tests/conftest.py). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile $(TEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check dreamgym tests benchmarks
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_shop.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
