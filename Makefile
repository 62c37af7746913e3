# The two commands a new user types: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test test-pythons lint typecheck unit bench soak mutate clean system-deps

# The suite runs again on each newer Python, over the subset below: every process, signal,
# engine, worker and store-contract test (docs/decisions.md, "Tests", says why this subset).
NEWER_PYTHONS ?= 3.12 3.13
NEWER_PYTHON_TESTS ?= tests/unit tests/golden tests/conformance tests/fleet tests/chaos \
	tests/integration/test_worker_processes.py tests/integration/test_worker_cli_processes.py \
	tests/integration/test_sqlite_processes.py tests/integration/test_dev_broken_import.py \
	tests/integration/test_fleet_health_port.py
PYENV_ROOT ?= $(HOME)/.pyenv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,postgres]"
	$(PY) -m compileall -q src > /dev/null
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) -m pyrula.examples

lint: install
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: install
	$(VENV)/bin/mypy

# The chaos suite's clock-jump scenarios run a fleet under libfaketime, and the dashboard's
# browser tests drive Debian's chromium (each skips without it): installed with apt where
# it is missing and this user may.
system-deps:
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && { apt-get install -y -qq faketime >/dev/null 2>&1 \
	            || { apt-get update -qq && apt-get install -y -qq faketime; } >/dev/null 2>&1; }; } \
	  || echo "faketime is not installed: the clock-jump scenarios will be skipped" >&2
	@command -v chromium >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && { apt-get install -y -qq chromium >/dev/null 2>&1 \
	            || { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null 2>&1; }; } \
	  || echo "chromium is not installed: the dashboard's browser tests will be skipped" >&2

test: install system-deps lint typecheck
	$(VENV)/bin/pytest -n 2 -q -p no:cacheprovider
	$(MAKE) --no-print-directory test-pythons

test-pythons: $(addprefix test-python-,$(NEWER_PYTHONS))

# `make test-python-3.13`: the subset on Python 3.13, in .venv-3.13 (installed as .venv is).
# The interpreter is python3.13 on PATH if it runs (a pyenv shim of a version pyenv has not
# selected does not), else the newest pyenv build of 3.13; with neither, it says so and
# skips that version.
test-python-%:
	@py=""; \
	for c in python$* $$(ls -d $(PYENV_ROOT)/versions/$*.*/bin/python$* 2>/dev/null | sort -V | tail -n 1); do \
		if "$$c" -c 'import sys' > /dev/null 2>&1; then py="$$c"; break; fi; \
	done; \
	if [ -z "$$py" ]; then \
		echo "test-python-$*: SKIPPED: no Python $* interpreter (neither python$* on PATH nor $(PYENV_ROOT)/versions/$*.*)"; \
		exit 0; \
	fi; \
	echo "test-python-$*: $$py ($$("$$py" -c 'import sys; print(sys.version.split()[0])'))"; \
	$(MAKE) --no-print-directory VENV=.venv-$* PYTHON="$$py" install && \
	.venv-$*/bin/pytest -n 2 -q -p no:cacheprovider $(NEWER_PYTHON_TESTS)

bench: install
	$(PY) -m compileall -q src > /dev/null
	$(PY) -m benchmarks
	PYTHONPATH=src:. $(PY) -m benchmarks.peers
	PYTHONPATH=src:. $(PY) -m benchmarks.scaling

soak: install
	$(VENV)/bin/pytest -q -p no:cacheprovider -m soak -s tests/chaos tests/fleet

# Mutation testing, not part of `make test` (docs/mutation.md): mutmut mutates the modules
# and runs the tests named in pyproject.toml's [tool.mutmut], then the score per module is
# printed (it fails under MUTATION_MIN percent). Each run starts afresh: a score is of
# today's code and tests, not of a cache.
MUTATION_MIN ?= 90
mutate: install
	rm -rf mutants
	nice -n 10 $(VENV)/bin/mutmut run
	$(PY) -m tests.mutation_score --min $(MUTATION_MIN)

clean:
	rm -rf mutants $(VENV) $(addprefix .venv-,$(NEWER_PYTHONS)) .mypy_cache .ruff_cache .pytest_cache build dist src/*.egg-info
