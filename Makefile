# gputap: `make demo` starts the whole platform on this machine; `make test` runs every test.
# Both set up what they need (virtualenv, npm packages) and can be run again safely.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.gputap-installed
NODE_STAMP := node_modules/.gputap-installed

.PHONY: setup demo test lint format bench system-packages clean

setup: $(PY_STAMP) $(NODE_STAMP)

$(PY_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: setup
	$(PY) -m hub_config.demo

# System packages the tests use: Chromium for the browser tests (Playwright drives
# /usr/bin/chromium) and gcc for the NVML test double. Installed with apt-get when root.
system-packages:
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc libc6-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $$missing; \
	  else echo "The tests need:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
	fi

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The long tests (real minutes of waiting: the billing outage) run beside the others, so
# `make test` takes the time of the slower half, not the sum; both must pass.
test: setup system-packages lint
	@$(PY) -m pytest -m long -p no:cacheprovider > .pytest-long.log 2>&1 & long=$$!; \
	$(PY) -m pytest -m "not long"; rest=$$?; \
	wait $$long; long_rc=$$?; \
	echo "--- long tests (-m long) ---"; cat .pytest-long.log; \
	test $$rest -eq 0 -a $$long_rc -eq 0

bench: setup
	$(PY) bench/placement.py
	$(PY) bench/form_render.py
	$(PY) bench/kube_spawn.py
	$(PY) bench/billing_pg.py

clean:
	rm -rf $(VENV) node_modules .demo .pytest_cache .hypothesis
