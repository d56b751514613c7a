# `make demo` and `make test` work on a fresh machine: they create .venv and install
# everything (torch 2.13.0 CPU first, so nothing pulls CUDA wheels).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.graphkit-installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[torch,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) samples/run_all.py

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/my_add.py

clean:
	rm -rf build *.egg-info .pytest_cache out
