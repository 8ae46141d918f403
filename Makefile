# Two entry points (see README): `make lab` runs the lab, `make test` runs the tests.
# Both set everything up first on a fresh machine; set-up steps are stamped so reruns are quick.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.labkit-installed

.PHONY: lab test setup setup-browser lint clean

lab: setup
	$(VENV)/bin/labkit lab

test: setup setup-browser
	$(VENV)/bin/ruff check labkit tests notebooks benchmarks
	$(VENV)/bin/pytest -q --durations=15

setup: $(STAMP) node_modules/.package-lock.json

# torch comes from constraints.txt: the CPU build (2.13.0) that lies on local disk here. An
# unpinned torch would pull a multi-GB CUDA build. GPU users: see README, "On a GPU machine".
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[notebooks,metis,dev]"
	touch $@

# the offline widget renderer and require.js for the preview site (npm registry)
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

# Debian's chromium, for the browser test of the preview site (root on these machines)
setup-browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

lint: setup
	$(VENV)/bin/ruff check labkit tests notebooks benchmarks

clean:
	rm -rf _executed _site _preview .pytest_cache
