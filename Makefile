# gputap: `make demo` starts the whole platform on this machine; `make test` runs every test.
# Both set up what they need (virtualenv, npm packages) and can be run again safely.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.gputap-installed
NODE_STAMP := node_modules/.gputap-installed
# the JupyterLab extension: TypeScript built into a prebuilt labextension, then pip-installed
LAB := extensions/gputap-lab
LAB_SOURCES := $(wildcard $(LAB)/src/*.ts $(LAB)/style/*) $(LAB)/package.json $(LAB)/tsconfig.json
LAB_BUILT := $(LAB)/gputap_lab/labextension/package.json
LAB_DIST := $(LAB)/dist
LAB_WHEEL := $(LAB_DIST)/.gputap-built
LAB_STAMP := $(VENV)/.gputap-lab-installed

# The hub image's Python set (images/hub/constraints.txt: JupyterHub 5.5.0 as z2jh 4.4.0's hub
# image ships it, KubeSpawner 7.1.0, ...) in a second virtualenv, where `make test-jh55` runs
# the hub-side tests again: .venv gets the newest JupyterHub gputap's range admits, the chart's
# hub and single-user images run 5.5 (docs/install-kubernetes.md, "JupyterHub 5.5, not 6").
JH55 := .venv-jh55
JH55_PY := $(JH55)/bin/python
JH55_BASE := $(JH55)/.gputap-packages
JH55_STAMP := $(JH55)/.gputap-installed
HUB_CONSTRAINTS := images/hub/constraints.txt

# The data-science environment `make demo` offers beside gputap's own (hub_config/environments.py):
# a virtualenv with its own jupyterhub-singleuser (the hub's JupyterHub), JupyterLab, gputap-lab,
# jupyter-server-proxy and TensorBoard, plus numpy, pandas, matplotlib and PyTorch's CPU build
# (torch==2.13.0, which pip takes from this machine's disk). Built once, reused.
DS := .venv-ds
DS_PY := $(DS)/bin/python
DS_BASE := $(DS)/.gputap-packages
DS_STAMP := $(DS)/.gputap-installed

# Installed by jupyter-events' jsonschema[format-nongpl] and imported by jsonschema whenever
# present, rfc3987-syntax builds an Earley parser at import: 0.8 to 2.5 CPU-seconds of every
# hub and server start (python -X importtime; jsonschema#1428). It checks only the "iri"
# formats, which no schema of JupyterHub, Jupyter Server or gputap uses, so every environment
# gputap makes removes it (docs/architecture.md, "Start-up cost"); pip check stays clean.
SLOW_IMPORTS := rfc3987-syntax

.PHONY: setup setup-jh55 setup-all demo test test-jh55 lint format bench gpu-check screenshots \
	system-packages clean

setup: $(PY_STAMP) $(NODE_STAMP) $(LAB_STAMP) $(DS_STAMP)

# `make test` and `make demo` build the environments side by side (SETUP_JOBS at once): the
# Lab extension is built into one wheel that each environment installs, and each
# environment's own packages go in while the others' do. The root package's editable installs
# come one after the other: both write gputap.egg-info in this folder.
SETUP_JOBS ?= 3

$(PY_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip uninstall --quiet --yes $(SLOW_IMPORTS)
	touch $@

$(NODE_STAMP): package.json package-lock.json $(LAB)/package.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

# tsc, then @jupyter/builder through the venv's jupyter-builder (offline; the old
# @jupyterlab/builder is not used). Rebuilt only when a source changed.
$(LAB_BUILT): $(LAB_SOURCES) $(NODE_STAMP) | $(PY_STAMP)
	cd $(LAB) && ../../node_modules/.bin/tsc --sourceMap
	cd $(LAB) && $(abspath $(VENV))/bin/jupyter-builder build .
	touch $@

# One wheel of the extension for every environment: it puts the labextension in the
# environment's share/jupyter/labextensions/gputap-lab and enables the server extension in its
# etc/jupyter/jupyter_server_config.d. Its dependencies come with each environment's packages.
$(LAB_WHEEL): $(LAB_BUILT) $(wildcard $(LAB)/gputap_lab/*.py $(LAB)/gputap/*.py) \
		$(wildcard $(LAB)/jupyter-config/*/*.json) $(LAB)/pyproject.toml | $(PY_STAMP)
	rm -rf $(LAB)/build $(LAB_DIST)  # setuptools would reuse a stale build/lib
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(LAB_DIST) ./$(LAB)
	touch $@

$(LAB_STAMP): $(LAB_WHEEL)
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(LAB_DIST)/*.whl
	touch $@

# the data-science environment's packages, then the extension's wheel
$(DS_BASE): pyproject.toml hub_config/environments.py | $(PY_STAMP)
	test -x $(DS_PY) || $(PYTHON) -m venv $(DS)
	$(DS_PY) -m pip install --quiet --upgrade pip
	$(PY) -m hub_config.environments requirements > $(DS)/requirements.txt
	$(DS_PY) -m pip install --quiet -r $(DS)/requirements.txt
	touch $@

$(DS_STAMP): $(DS_BASE) $(LAB_WHEEL)
	$(DS_PY) -m pip install --quiet --no-deps --force-reinstall $(LAB_DIST)/*.whl
	$(DS_PY) -m pip uninstall --quiet --yes $(SLOW_IMPORTS)
	$(DS_PY) -m pip check
	touch $@

# gputap as the hub image installs it (under its constraints), with the test tools and the
# Lab extension built above, so that the servers run the single-user image's JupyterHub too;
# `pip check` fails the build when the pinned set does not hold together
setup-jh55: $(JH55_STAMP)

# every environment the tests use, SETUP_JOBS builds at once
setup-all:
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) -Otarget setup setup-jh55

$(JH55_BASE): pyproject.toml $(HUB_CONSTRAINTS) | $(PY_STAMP)
	test -x $(JH55_PY) || $(PYTHON) -m venv $(JH55)
	$(JH55_PY) -m pip install --quiet --upgrade pip
	$(JH55_PY) -m pip install --quiet --constraint $(HUB_CONSTRAINTS) -e ".[test]"
	touch $@

$(JH55_STAMP): $(JH55_BASE) $(LAB_WHEEL)
	$(JH55_PY) -m pip install --quiet --no-deps --force-reinstall $(LAB_DIST)/*.whl
	$(JH55_PY) -m pip uninstall --quiet --yes $(SLOW_IMPORTS)
	$(JH55_PY) -m pip check
	touch $@

# GPUTAP_DEMO_GITHUB=1: GitHub login through the tests' stand-in of GitHub, started by a
# development tool (tests/github_sim/demo.py) that then runs the same demo
demo:
	@$(MAKE) --no-print-directory -j$(SETUP_JOBS) -Otarget setup
	@if [ "$$GPUTAP_DEMO_GITHUB" = 1 ]; then $(PY) -m tests.github_sim.demo; \
	else $(PY) -m hub_config.demo; fi

# System packages the tests use: Chromium for the browser tests (Playwright drives
# /usr/bin/chromium), gcc for the NVML test double, ip and setpriv (with nsenter and unshare)
# for the simulated cluster's pods. Installed with apt-get when root.
system-packages:
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v setpriv >/dev/null 2>&1 || missing="$$missing util-linux"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $$missing; \
	  else echo "The tests need:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
	fi

# The README's screenshots (docs/images), taken by the Chromium tests that check those pages
SCREENSHOT_TESTS := tests/browser/test_lab_e2e.py tests/browser/test_lab_stops.py \
	tests/browser/test_money_browser.py tests/browser/test_hub_pages.py \
	tests/browser/test_scale_out_browser.py
screenshots: setup system-packages
	GPUTAP_SCREENSHOTS=docs/images $(PY) -m pytest $(SCREENSHOT_TESTS) -q -n 2 --dist loadfile

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The long tests (real minutes of waiting: the billing outage) run beside the others, so
# `make test` takes the time of the slower half, not the sum; both must pass. Most tests wait
# on real servers rather than compute, so they run in TEST_WORKERS processes, a test file
# per process (its module fixtures, such as a started platform, stay shared). The hub image's
# run (make test-jh55) comes after: beside them as well, on two cores, it broke the tests'
# real-time budgets (a credit stop's overrun) and gained little, the CPU being the limit.
# Each test runs on the JupyterHub that runs its code in use: the one-machine tests and the
# unit tests on .venv's (what `make demo` runs); the Kubernetes backend's (tests/kube) and the
# chart's (tests/helm) on the hub image's Python set (test-jh55: the chart's hub is that
# image, docs/install-kubernetes.md); GitHub login and the hub's own handlers, which both
# hubs serve, on both. Every run ends with its DURATIONS slowest tests, setup and teardown
# included, where CI's time goes.
TEST_WORKERS ?= 4
DURATIONS := --durations=50
IMAGE_ONLY_TESTS := tests/kube tests/helm
test: setup-all system-packages lint
	@$(PY) -m pytest -m long -p no:cacheprovider $(DURATIONS) > .pytest-long.log 2>&1 & \
	long=$$!; \
	$(PY) -m pytest -m "not long" -n $(TEST_WORKERS) --dist loadfile $(DURATIONS) \
	  $(addprefix --ignore=,$(IMAGE_ONLY_TESTS)); \
	rest=$$?; \
	wait $$long; long_rc=$$?; \
	echo "--- long tests (-m long) ---"; cat .pytest-long.log; \
	echo "--- the hub image's JupyterHub 5.5: Kubernetes, the chart, GitHub login (make test-jh55) ---"; \
	$(MAKE) --no-print-directory test-jh55; jh55=$$?; \
	test $$rest -eq 0 -a $$long_rc -eq 0 -a $$jh55 -eq 0

# The tests of what the hub image runs (z2jh 4.4.0's JupyterHub 5.5, KubeSpawner 7.1, ...), in
# .venv-jh55: the Kubernetes backend and the API handlers on it (tests/kube), the chart's hub
# and its settings (tests/helm), both only here, and GitHub login (the chart's login).
# The hub, billing and the servers they start are that venv's jupyterhub,
# jupyterhub-singleuser and KubeSpawner, as the chart's images hold them. GPUTAP_HUB_PINS makes
# tests/helm/test_hub_pins.py check that this is so. The one-machine backend never runs on
# the image, so its tests (tests/integration) run on .venv alone, but for those of the hub's
# own handlers and scopes, which the chart's hub serves whatever its backend: the security of
# every gputap endpoint (test_security_hub.py) and the server API (test_server_api.py). The
# unit tests (pure logic and configuration, no JupyterHub running) run once, on .venv.
JH55_TESTS := $(IMAGE_ONLY_TESTS) $(wildcard tests/integration/test_github_*.py) \
  tests/integration/test_security_hub.py tests/integration/test_server_api.py
test-jh55: setup-jh55 system-packages
	GPUTAP_HUB_PINS=$(HUB_CONSTRAINTS) $(JH55_PY) -m pytest -m "not long" -p no:cacheprovider \
	  -n $(TEST_WORKERS) --dist loadfile $(DURATIONS) $(JH55_TESTS)

# what NVML reports, what gputap offers for it, and whether servers and the idle rule see the
# GPUs right: run it on a GPU machine (README, "On a GPU machine")
gpu-check: setup
	$(PY) bench/gpu_check.py

bench: setup setup-jh55
	$(PY) bench/placement.py
	$(PY) bench/form_render.py
	$(PY) bench/kube_spawn.py
	$(PY) bench/billing_pg.py
	$(PY) bench/class_spawn.py
	$(PY) bench/instant_start.py
	$(PY) bench/scale_out.py
	$(PY) bench/demo_stop.py
	$(JH55_PY) bench/kube_scale_out.py

clean:
	rm -rf $(VENV) $(JH55) $(DS) node_modules .demo .pytest_cache .hypothesis
	rm -rf $(LAB)/lib $(LAB)/gputap_lab/labextension $(LAB)/tsconfig.tsbuildinfo $(LAB)/build \
	  $(LAB_DIST)
