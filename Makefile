# `make demo` and `make test` work on a fresh machine: they create .venv and install
# everything (torch 2.13.0 first, then graphkit with its extras).
# TORCH_INDEX_URL picks the index torch is installed from; empty (the default) uses pip's
# configured index. On an ordinary machine with PyPI, a CPU-only torch (~200 MB instead of
# ~2.7 GB of CUDA wheels) comes from
#   make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
PYTHON ?= python3
TORCH_INDEX_URL ?=
TORCH_INDEX_OPT := $(if $(strip $(TORCH_INDEX_URL)),--index-url $(strip $(TORCH_INDEX_URL)),)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.graphkit-installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_INDEX_OPT) torch==2.13.0
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
