# Two entry points: `make run` (dashboard) and `make test` (whole suite).
# Both build the local virtual environment at .venv from requirements.txt first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d" " -f1)
PORT ?= 8501

.PHONY: run test install browser postgres bench

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	rm -f $(VENV)/.installed-* && touch $@

run: install
	$(VENV)/bin/streamlit run app/main.py --server.port $(PORT) --server.address 127.0.0.1 --server.headless true

browser:
	bash scripts/install_browser.sh

postgres:
	bash scripts/install_postgres.sh

test: install browser postgres
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check engine app storage bench tests
	$(PY) -m pytest -q

bench: install
	$(PY) bench/layer_speed.py
	$(PY) bench/memory.py
	$(PY) bench/memory.py --defaults
	$(PY) bench/throughput.py
	$(PY) bench/checkpoint.py
	$(PY) bench/fleet.py
	$(PY) bench/diagnose.py
