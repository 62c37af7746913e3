# The two commands a new user types: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test test-pythons lint typecheck unit bench soak fuzz mutate clean system-deps

# The suite runs again on each newer Python, over the subset below: every process, signal,
# engine, worker and store-contract test (docs/decisions.md, "Tests", says why this subset).
NEWER_PYTHONS ?= 3.12 3.13
NEWER_PYTHON_TESTS ?= tests/unit tests/golden tests/conformance tests/fleet tests/chaos \
	tests/integration/test_worker_processes.py tests/integration/test_worker_cli_processes.py \
	tests/integration/test_sqlite_processes.py tests/integration/test_dev_broken_import.py \
	tests/integration/test_fleet_health_port.py
# 3.13 runs that subset less the chaos scenarios and the store contract, which 3.12 runs:
# what depends on the interpreter (asyncio, signals, the fork server, sqlite3) is in the
# unit, fleet and process tests both versions run, and make test stays near 15 minutes.
NEWER_PYTHON_TESTS_3.13 ?= $(filter-out tests/chaos tests/conformance,$(NEWER_PYTHON_TESTS))
PYENV_ROOT ?= $(HOME)/.pyenv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,postgres]"
	$(PY) -m compileall -q src > /dev/null
	touch $(STAMP)

install: $(STAMP)

# Bytecode refreshed first (~40 ms when nothing changed): where PYTHONDONTWRITEBYTECODE is
# set, nothing else writes it, and the fleet's fork server would compile every module
# changed since the install on each start, on the way to the first run.
run: install
	$(PY) -m compileall -q src > /dev/null
	$(PY) -m pyrula.examples

lint: install
	$(VENV)/bin/ruff check src tests benchmarks

typecheck: install
	$(VENV)/bin/mypy

# Tools some tests need, installed with apt where they are missing and this user may (each
# area's tests skip without its tool, and fail under CI=true: tests/tools.py): libfaketime
# (the chaos suite's clock-jump scenarios), chromium (the dashboard's browser tests),
# PostgreSQL's server binaries (initdb and pg_ctl for the private clusters of the archive
# outage scenarios), openssl (the Valkey TLS tests), docker-compose (the offline check of
# compose.yaml). Not redis-server, which those tests
# need too: its package would start a server on the machine's port 6379.
# $(call apt_dep,CHECK,PACKAGE,WHAT IS SKIPPED WITHOUT IT)
define apt_dep
	@$(1) >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	       && { apt-get install -y -qq $(2) >/dev/null 2>&1 \
	            || { apt-get update -qq && apt-get install -y -qq $(2); } >/dev/null 2>&1; }; } \
	  || echo "$(2) is not installed: $(3) will be skipped" >&2
endef

system-deps:
	$(call apt_dep,ls /usr/lib/*/faketime/libfaketime.so.1,faketime,the clock-jump scenarios)
	$(call apt_dep,command -v chromium,chromium,the dashboard's browser tests)
	$(call apt_dep,ls /usr/lib/postgresql/*/bin/initdb /usr/lib/postgresql/*/bin/pg_ctl,postgresql,the archive outage scenarios)
	$(call apt_dep,command -v openssl,openssl,the Valkey TLS tests)
	$(call apt_dep,command -v docker-compose,docker-compose,the compose.yaml check)

# Every run of `make test` (this Python's, each newer one's, a newer one missing) adds the
# areas it skipped for a missing tool to SKIPPED_AREAS; the last line lists them all.
SKIPPED_AREAS := $(VENV)/skipped-areas
test: export PYRULA_SKIPPED_AREAS = $(abspath $(SKIPPED_AREAS))

test: install system-deps lint typecheck
	@rm -f $(SKIPPED_AREAS)
	$(VENV)/bin/pytest -n 2 -q -p no:cacheprovider
	$(MAKE) --no-print-directory test-pythons
	@$(PY) -m tests.tools $(SKIPPED_AREAS)

test-pythons: $(addprefix test-python-,$(NEWER_PYTHONS))

# `make test-python-3.13`: the subset on Python 3.13, in .venv-3.13 (installed as .venv is).
# The interpreter is python3.13 on PATH if it runs (a pyenv shim of a version pyenv has not
# selected does not), else the newest pyenv build of 3.13; with neither, it says so and
# skips that version (under CI=true it fails).
test-python-%:
	@py=""; \
	for c in python$* $$(ls -d $(PYENV_ROOT)/versions/$*.*/bin/python$* 2>/dev/null | sort -V | tail -n 1); do \
		if "$$c" -c 'import sys' > /dev/null 2>&1; then py="$$c"; break; fi; \
	done; \
	if [ -z "$$py" ]; then \
		why="no Python $* interpreter (neither python$* on PATH nor $(PYENV_ROOT)/versions/$*.*)"; \
		if [ "$$CI" = true ]; then echo "test-python-$*: FAILED under CI=true: $$why" >&2; exit 1; fi; \
		echo "test-python-$*: SKIPPED: $$why"; \
		[ -z "$$PYRULA_SKIPPED_AREAS" ] || echo "Python $* (the suite on Python $*): $$why" >> "$$PYRULA_SKIPPED_AREAS"; \
		exit 0; \
	fi; \
	echo "test-python-$*: $$py ($$("$$py" -c 'import sys; print(sys.version.split()[0])'))"; \
	$(MAKE) --no-print-directory VENV=.venv-$* PYTHON="$$py" install && \
	.venv-$*/bin/pytest -n 2 -q -p no:cacheprovider $(or $(NEWER_PYTHON_TESTS_$*),$(NEWER_PYTHON_TESTS))

bench: install
	$(PY) -m compileall -q src > /dev/null
	$(PY) -m benchmarks
	PYTHONPATH=src:. $(PY) -m benchmarks.peers
	PYTHONPATH=src:. $(PY) -m benchmarks.scaling
	PYTHONPATH=src:. $(PY) -m benchmarks.durability

soak: install
	$(VENV)/bin/pytest -q -p no:cacheprovider -m soak -s tests/chaos tests/fleet

# `make fuzz`: the randomised fault schedules (tests/chaos/test_fault_schedules.py), FUZZ_RUNS
# seeds not tried before (from FUZZ_FROM on, drawn here once so both xdist workers collect
# the same), then the generative tests with many more examples and steps (FUZZ_EXAMPLES,
# FUZZ_STEPS) and no per-test timeout, so a failure found is also shrunk.
# `make fuzz SEED=1234` replays that one fault schedule alone, its output shown.
FUZZ_RUNS ?= 20
FUZZ_EXAMPLES ?= 200
FUZZ_STEPS ?= 30
ifndef FUZZ_FROM
FUZZ_FROM := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
fuzz: install system-deps
	@if [ -n "$(SEED)" ]; then \
		PYRULA_FUZZ_SEED="$(SEED)" $(VENV)/bin/pytest -q -s -p no:cacheprovider \
			tests/chaos/test_fault_schedules.py -k test_a_fault_schedule; \
	else \
		echo "fuzz: $(FUZZ_RUNS) fault schedules from seed $(FUZZ_FROM)"; \
		PYRULA_FUZZ_RUNS="$(FUZZ_RUNS)" PYRULA_FUZZ_FROM="$(FUZZ_FROM)" $(VENV)/bin/pytest \
			-n 2 -q -p no:cacheprovider tests/chaos/test_fault_schedules.py \
			-k test_a_fault_schedule && \
		echo "fuzz: the generative tests, $(FUZZ_EXAMPLES) examples of $(FUZZ_STEPS) steps" && \
		PYRULA_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) PYRULA_FUZZ_STEPS=$(FUZZ_STEPS) \
			$(VENV)/bin/pytest -n 2 -q -p no:cacheprovider --timeout=0 tests/generative; \
	fi

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
