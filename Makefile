# Two entry points, each sets itself up first:
#   make compare   the main job: compare on the default workload config (results under results/)
#   make test      the CPU test suite (what CI runs through .ci/run), on $(TEST_JOBS) pytest-xdist workers
#   make test-fast the same without the tests marked slow: the edit loop (under 2 minutes on 2 cores)
# On the GPU machine nothing is installed: run from the checkout with NO_VENV=1 (uses $(PYTHON) and
# PYTHONPATH=. ahead of any PYTHONPATH you set, e.g. one holding a peer's wheel), e.g.
# `make compare NO_VENV=1 PYTHON=python3`.

PYTHON ?= python3
VENV   := .venv
CONFIG ?= default
ARGS   ?=
TEST_JOBS ?= 2

ifeq ($(NO_VENV),1)
  PY    := PYTHONPATH=.$(if $(PYTHONPATH),:$(PYTHONPATH)) $(PYTHON)
  SETUP :=
  # no venv: the workers only where pytest-xdist is installed (the [test] extra brings it into .venv)
  XDIST = $(if $(shell $(PYTHON) -c "import xdist" 2>/dev/null && echo y),-n $(TEST_JOBS))
else
  PY    := $(VENV)/bin/python
  SETUP := $(VENV)/.installed
  XDIST := -n $(TEST_JOBS)
endif

.PHONY: compare test test-fast lint clean

# torch comes pinned to 2.13.0 (the CPU build on disk): an unpinned torch would pull GBs of CUDA wheels.
$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VENV)/bin/python -m pip install -q -e ".[test,harness]"
	touch $@

compare: $(SETUP)
	$(PY) -m compare run --config $(CONFIG) $(ARGS)

# tests/conftest.py schedules the workers (a file's nvcc build or compare run stays on one worker)
test: $(SETUP)
	$(PY) -m pytest -m "not gpu" -q $(XDIST) $(ARGS)

test-fast: $(SETUP)
	$(PY) -m pytest -m "not gpu and not slow" -q $(XDIST) $(ARGS)

lint: $(SETUP)
	$(PY) -m ruff check pallas_attn cuda_ref compare tests scripts

clean:
	rm -rf $(VENV) .pytest_cache
