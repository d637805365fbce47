# metricvault: `make demo` runs the main job, `make test` runs the whole suite.
# Both create .venv and install what they need; `make test` also installs the Debian
# packages that the end-to-end tests start as real servers (when run as root).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
APT_TEST_PACKAGES ?= git prometheus influxdb-client influxdb prometheus-node-exporter prometheus-alertmanager chromium chromium-driver postgresql

.PHONY: demo test lint unit e2e bench clean system-deps

$(BIN)/metricvault: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[archive]'
	touch $@

$(VENV)/.test-deps: $(BIN)/metricvault
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/metricvault
	@command -v git >/dev/null || echo "git is missing: the demo's archive step needs it (apt-get install git)"
	$(BIN)/metricvault demo

system-deps:
	@missing=""; for p in $(APT_TEST_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

lint: $(VENV)/.test-deps
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy --strict src
	$(BIN)/mypy tests

# The suite runs its files in parallel (pytest-xdist, one file per worker at a time so that
# module fixtures are built once): most end-to-end time is spent waiting on real servers, so
# more workers than cores pays. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 4
test: $(VENV)/.test-deps system-deps lint
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=30 tests

unit: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q tests/unit

e2e: $(VENV)/.test-deps system-deps
	$(BIN)/python -m pytest -q tests/e2e

# The benches compare against VictoriaMetrics (Debian's victoria-metrics) and profile with py-spy.
bench: $(VENV)/.test-deps
	$(MAKE) system-deps APT_TEST_PACKAGES="$(APT_TEST_PACKAGES) victoria-metrics"
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/storage.py

.PHONY: bench-archive
bench-archive: $(VENV)/.test-deps
	$(BIN)/python bench/archive.py

clean:
	rm -rf $(VENV) metricvault-data .metricvault-state demo-report.html
