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

.PHONY: install sysdeps demo test bench docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_INDEX_OPT) torch==2.13.0
	$(PY) -m pip install --quiet -e '.[torch,dev]'
	touch $(STAMP)

# graphviz draws `graphkit show` / `rewrite --diff` pictures; chromium lets the tests look at
# them. Installed with apt where we are root on Debian/Ubuntu; elsewhere a note says what to install.
sysdeps:
	@if command -v dot >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing graphviz and chromium (apt-get)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz chromium >/dev/null) \
	    || echo "note: apt-get failed: install graphviz for pictures"; \
	else echo "note: install graphviz (dot) for graphkit show / rewrite --diff pictures"; fi

demo: $(STAMP) sysdeps
	$(PY) samples/run_all.py

test: $(STAMP) sysdeps
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/my_add.py

# The pages in docs/ as a site in site/ (mkdocs.yml: nav over docs/; warnings are errors).
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

clean:
	rm -rf build *.egg-info .pytest_cache out site
