# The two commands a new user types: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test lint typecheck unit bench soak clean system-deps

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

# The chaos suite's clock-jump scenarios run a fleet under libfaketime (they skip without
# it): installed with apt where it is missing and this user may.
system-deps:
	@ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && { apt-get install -y -qq faketime >/dev/null 2>&1 \
	            || { apt-get update -qq && apt-get install -y -qq faketime; } >/dev/null 2>&1; }; } \
	  || echo "faketime is not installed: the clock-jump scenarios will be skipped" >&2

test: install system-deps lint typecheck
	$(VENV)/bin/pytest -n 2 -q -p no:cacheprovider

bench: install
	$(PY) -m compileall -q src > /dev/null
	$(PY) -m benchmarks
	PYTHONPATH=src:. $(PY) -m benchmarks.peers
	PYTHONPATH=src:. $(PY) -m benchmarks.scaling

soak: install
	$(VENV)/bin/pytest -q -p no:cacheprovider -m soak -s tests/chaos

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist src/*.egg-info
