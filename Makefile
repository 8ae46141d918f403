# Two entry points (see README): `make lab` runs the lab, `make test` runs the tests;
# `make notebook` opens the tutorials in JupyterLab.
# Both set everything up first on a fresh machine; set-up steps are stamped so reruns are quick.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.labkit-installed

.PHONY: lab test notebook setup setup-browser setup-slurm lint clean

# the Quarto website when `quarto` is on PATH, else the preview; the last lines say which
lab: setup
	$(VENV)/bin/labkit lab

# JupyterLab of .venv on notebooks/, the labkit-python3 kernel registered; --allow-root only
# when run as root. A notebook writes its results to notebooks/results/ (git-ignored).
notebook: setup
	$(VENV)/bin/labkit notebook

test: setup setup-browser setup-slurm
	$(VENV)/bin/ruff check labkit tests notebooks benchmarks
	$(VENV)/bin/pytest -q --durations=15

setup: $(STAMP) node_modules/.package-lock.json

# torch comes from constraints.txt: the CPU build (2.13.0) that lies on local disk here. An
# unpinned torch would pull a multi-GB CUDA build. GPU users: see README, "On a GPU machine".
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[notebooks,metis,dev,mlsysim]"
	touch $@

# the offline widget renderer, require.js, jQuery and MathJax for both websites (npm registry)
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error

# A browser for the browser tests (JupyterLab, the Quarto site, the preview), driven by Playwright
# from the dev extra: tests/_browser.py finds Playwright's own chromium or a chromium on PATH and
# says which. Where there is none, Debian's chromium is installed when make runs as root with
# apt; elsewhere nothing is installed, and those tests are skipped and say why
setup-browser: setup
	@if found=$$($(PY) -m tests._browser); then echo "setup-browser: $$found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "setup-browser: installing Debian's chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "setup-browser: not root with apt-get: the browser tests will be skipped ($$found)"; fi

# Debian's slurm-wlm and munge, for the test against a real SLURM (tests/slurm/ starts its own
# daemons, nothing is enabled): installed when make runs as root with apt; elsewhere that test is
# skipped and says why
setup-slurm:
	@test -x /usr/sbin/slurmd -a -x /usr/sbin/slurmctld -a -x /usr/sbin/munged || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null; \
	else echo "setup-slurm: not root with apt-get: the real-SLURM test will be skipped"; fi

lint: setup
	$(VENV)/bin/ruff check labkit tests notebooks benchmarks

clean:
	rm -rf _executed _site _preview .quarto .pytest_cache
