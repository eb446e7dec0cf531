# make run:  set up .venv and run the main example on the CPU (compile, run, verify, time)
# make test: set up .venv, then pytest and lit
# make fuzz: 2000 random problems compiled for the host and checked (CONVBW_FUZZ_EXAMPLES to change)
# make emulate-amd: every AMD form x every dense suite problem (layouts 4 and 2, f16 and bf16) through the CPU
#                   emulator, with counts (slow: ~1.5 h on 2 cores; tests/emulate_amd.py --layouts/--dtypes/--only for less)
# make mutate: cosmic-ray over the numerically critical functions (tests/mutation/*.toml; long: hours;
#              it edits those sources in place while it runs, one mutant at a time; docs/mutation.md)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# test-torch: torch==2.13.0 (CPU build), so make test runs the torch tests; TEST_EXTRAS=test leaves torch out
TEST_EXTRAS ?= test,test-torch

.PHONY: setup run test pytest lit lint clean fuzz emulate-amd mutate
MUTATION ?= $(wildcard tests/mutation/*.toml)

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(TEST_EXTRAS)]'
	touch $(STAMP)

run: setup
	$(PY) examples/quickstart.py

pytest: setup
	$(PY) -m pytest

lit: setup
	$(VENV)/bin/lit -sv lit

test: pytest lit

fuzz: setup
	CONVBW_FUZZ_EXAMPLES=$${CONVBW_FUZZ_EXAMPLES:-2000} $(PY) -m pytest tests/test_fuzz.py

emulate-amd: setup
	$(PY) tests/emulate_amd.py

mutate: setup
	$(PY) -m pip install -q -e '.[mutation]'
	mkdir -p build/mutation
	set -e; for config in $(MUTATION); do \
	  session=build/mutation/$$(basename $$config .toml).sqlite; rm -f $$session; \
	  PATH=$(VENV)/bin:$$PATH $(VENV)/bin/cosmic-ray init $$config $$session; \
	  $(PY) tests/mutation/scope.py $$config $$session; \
	  PATH=$(VENV)/bin:$$PATH nice -n 10 $(VENV)/bin/cosmic-ray exec $$config $$session; \
	  $(PY) tests/mutation/scope.py --report $$session; \
	done

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info lit/Output .pytest_cache
