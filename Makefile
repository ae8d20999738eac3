# trainops: `make demo` runs the whole pipeline on the embedded default; `make test` runs the suite.
# Both create the environment first if it is missing (Python 3.11, pip, .venv in the checkout).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trainops-installed

.PHONY: demo test test-fast lint format airflow venv clean-demo clean

# A few lines per task and attempt, then the summary; the full log goes to a file it names.
# `make demo V=1` prints everything instead.
demo: $(STAMP)
	$(PY) -m trainops demo $(if $(V),--verbose)

# The tests run on several processes (pytest-xdist; tests that share an expensive fixture stay
# on one, see tests/conftest.py). The unit tests compute: one worker per core. The slow ones
# mostly wait (torchrun gangs, Airflow's scheduler, Spark, subprocesses): one worker more keeps
# the cores busy. `make test TEST_WORKERS=0` runs everything in one process (for --pdb).
CORES := $(shell nproc 2>/dev/null || echo 2)
TEST_WORKERS ?= $(shell echo $$(($(CORES) + 1)))
FAST_WORKERS ?= $(CORES)

# Everything: torchrun, whole DAGs, a real Airflow, Chromium, Spark.
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# The unit tests only (not marked slow; every test file keeps some): under 2 minutes on 2 cores.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(FAST_WORKERS)

# What CI checks before the tests: lint, formatting and types (config in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Rewrite the tree in the project's format and apply ruff's safe fixes.
format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Airflow itself (scheduler, DAG processor, triggerer, API server on :8080) with these DAGs.
airflow: $(STAMP)
	$(PY) -m trainops airflow

venv: $(STAMP)

# Reinstall when the dependency set changes. The constraints file pins the tested set
# (torch==2.13.0 resolves to the CPU wheel on these machines, never a multi-GB CUDA build).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[airflow,trainer,spark,dev]'
	@# setuptools leaves trainops.egg-info here; on sys.path (cwd) it would make Airflow see
	@# the distribution twice and report its plugin entry point as registered twice.
	rm -rf trainops.egg-info
	touch $(STAMP)

# Forget demo state (Airflow DB, storage, local jobs) but keep the venv.
clean-demo:
	rm -rf .airflow .trainops

clean: clean-demo
	rm -rf $(VENV)
