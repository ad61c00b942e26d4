# Two entry points, each sets itself up first:
#   make compare   the main job: compare on the default workload config (results under results/)
#   make test      the CPU test suite (what CI runs through .ci/run)
# On the GPU machine nothing is installed: run from the checkout with NO_VENV=1 (uses $(PYTHON) and
# PYTHONPATH=.), e.g. `make compare NO_VENV=1 PYTHON=python3`.

PYTHON ?= python3
VENV   := .venv
CONFIG ?= default
ARGS   ?=

ifeq ($(NO_VENV),1)
  PY    := PYTHONPATH=. $(PYTHON)
  SETUP :=
else
  PY    := $(VENV)/bin/python
  SETUP := $(VENV)/.installed
endif

.PHONY: compare test lint clean

# torch comes pinned to 2.13.0 (the CPU build on disk): an unpinned torch would pull GBs of CUDA wheels.
$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VENV)/bin/python -m pip install -q -e ".[test]"
	touch $@

compare: $(SETUP)
	$(PY) -m compare run --config $(CONFIG) $(ARGS)

test: $(SETUP)
	$(PY) -m pytest -m "not gpu" -q $(ARGS)

lint: $(SETUP)
	$(PY) -m ruff check pallas_attn cuda_ref compare tests scripts

clean:
	rm -rf $(VENV) .pytest_cache
