# Two entry points: `make run` (dashboard) and `make test` (whole suite).
# Each builds the local virtual environment at .venv from a lock compiled from
# pyproject.toml (`make lock`): every transitive package pinned, with its hashes.
# `make run` installs requirements.txt (runtime only: no pytest, no Playwright);
# `make test` installs requirements-test.txt (runtime + the test extra);
# `make install-cuda` adds requirements-cuda.txt (runtime + the cuda extra) for NVIDIA GPUs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# uv installs the locks (parallel downloads and unpacking: ~10 s where pip took ~35 s) and
# checks the result; pip installs uv.
UV_VERSION := 0.13.8
# pip-compile resolves the locks with this pip
PIP_VERSION := 26.3
PIP_TOOLS_VERSION := 7.6.2
# A stamp per lock, named for the lock's (and pyproject's) checksum: a changed lock reinstalls.
RUN_STAMP := $(VENV)/.installed-run-$(shell cat requirements.txt pyproject.toml | cksum | cut -d" " -f1)
TEST_STAMP := $(VENV)/.installed-test-$(shell cat requirements-test.txt pyproject.toml | cksum | cut -d" " -f1)
PORT ?= 8501
UV_PIP := $(VENV)/bin/uv pip
# uv installs no bytecode. `make install` compiles all of it on every core (skipping the
# packages' own test suites, never imported; then this project's own packages, an editable
# install), so the dashboard starts from bytecode even where PYTHONDONTWRITEBYTECODE is set.
# `make test` instead lets its processes write the bytecode of what they import
# (TEST_BYTECODE): the suite imports a fraction of the lock, and all of it took 36 CPU s to
# compile; without either, each of the ~120 processes the suite starts compiles its imports again.
BYTECODE := $(PY) -m compileall -q -j 0 -x '/tests/' $(VENV)/lib && $(PY) -m compileall -q -j 0 engine storage app tests
TEST_BYTECODE := env -u PYTHONDONTWRITEBYTECODE
XDIST := -n 3 --dist loadfile --no-loadscope-reorder  # files longest first: tests/cpu_time.py

.PHONY: run test test-fast install install-test install-cuda lock browser postgres system checks test-ready bench test-costs

# $(1): the lock to install; $(2): the stamp family (run or test); $(3): a last step.
define install_lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(UV_PIP) install --python $(PY) --quiet --require-hashes -r $(1)
	$(UV_PIP) install --python $(PY) --quiet --no-deps -e .
	$(UV_PIP) check --python $(PY)
	$(3)
	rm -f $(VENV)/.installed-$(2)-* && touch $@
endef

install: $(RUN_STAMP)

install-test: $(TEST_STAMP)

$(RUN_STAMP): requirements.txt pyproject.toml
	$(call install_lock,requirements.txt,run,$(BYTECODE))

$(TEST_STAMP): requirements-test.txt pyproject.toml
	$(call install_lock,requirements-test.txt,test)

run: install
	$(VENV)/bin/basis-lab-dashboard --port $(PORT)

# NVIDIA GPUs (CUDA 12, Linux): into the .venv that `make run` or `make test` built, the cuda
# extra from its own hashed lock (the runtime lock's pins, plus JAX's CUDA plugin at the locked
# jax's version, NVIDIA's libraries and nvidia-ml-py for the GPU metrics): some GB of wheels.
install-cuda:
	test -x $(PY) || $(MAKE) install
	$(PY) -m pip install --quiet --require-hashes -r requirements-cuda.txt
	$(PY) -m pip check

# Recompiles the locks from pyproject.toml, keeping every pin that still satisfies it
# (`make lock LOCK_FLAGS=--upgrade` moves everything to the newest allowed versions).
# The test and cuda locks are constrained by the runtime lock, so they never disagree with it.
# (The cuda lock's hashes come from the index: about 11 minutes here, no CUDA wheel installed.)
LOCK_FLAGS ?=
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
	--strip-extras --no-emit-index-url --no-emit-find-links $(LOCK_FLAGS)
lock:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet pip==$(PIP_VERSION) pip-tools==$(PIP_TOOLS_VERSION)
	$(PIP_COMPILE) --output-file requirements.txt pyproject.toml
	$(PIP_COMPILE) --extra test -c requirements.txt --output-file requirements-test.txt pyproject.toml
	$(PIP_COMPILE) --extra cuda -c requirements.txt --output-file requirements-cuda.txt pyproject.toml

browser:
	bash scripts/install_browser.sh

postgres:
	bash scripts/install_postgres.sh

slurm:
	bash scripts/install_slurm.sh

# Chromium, PostgreSQL and Slurm one after the other: apt-get holds one lock for all.
system:
	bash scripts/install_browser.sh
	bash scripts/install_postgres.sh
	bash scripts/install_slurm.sh

checks: install-test
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check engine app storage bench tests
	$(VENV)/bin/mypy engine storage app

# PostgreSQL installs beside the Python lock and the checks. Chromium installs in the background
# from the start, through the checks and the first tests: the browser tests wait for it
# (scripts/install_browser.sh), and the first of them starts minutes into the suite.
test-ready: checks postgres slurm

test:
	bash scripts/install_browser.sh --background
	$(MAKE) --no-print-directory -j 2 --output-sync=target test-ready
	$(TEST_BYTECODE) $(PY) -m pytest -q $(XDIST) --durations=25

# The inner loop: the pure-function and math tests (no database server, browser or engine
# process), compiled as the whole suite's own processes compile (tests/support/xla.py).
FAST_TESTS := tests/test_code_shape.py tests/test_cpu_costs.py tests/app/test_charts.py tests/app/test_guard.py \
	tests/app/test_secrets.py tests/engine/test_basis.py tests/engine/test_config.py tests/engine/test_diagnostics.py \
	tests/engine/test_draws.py tests/engine/test_head.py tests/engine/test_memory.py tests/engine/test_model.py \
	tests/engine/test_parallel.py tests/engine/test_preflight.py tests/engine/test_reproduce.py \
	tests/engine/test_safety.py tests/engine/test_seed_range.py tests/engine/test_system.py \
	tests/engine/test_validation_rule.py
test-fast: install-test
	$(TEST_BYTECODE) $(PY) -m pytest -q $(XDIST) $(FAST_TESTS)

test-costs: install-test system  # rewrite tests/cpu_costs.json, the order make test hands files out in
	$(TEST_BYTECODE) $(PY) -m pytest -q $(XDIST) --cpu-record

bench: install
	$(PY) bench/step.py
	$(PY) bench/layer_speed.py
	$(PY) bench/memory.py
	$(PY) bench/memory.py --defaults
	$(PY) bench/throughput.py
	$(PY) bench/checkpoint.py
	$(PY) bench/fleet.py
	$(PY) bench/diagnose.py
