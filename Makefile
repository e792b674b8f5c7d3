# build-sandbox-image — developer and CI entry points.
#   make test       set up the machine (scripts/setup-env.sh), then run the whole test suite on
#                   every core (XDIST= for one process).
#                   PYTEST_ARGS passes arguments through, e.g. make test PYTEST_ARGS=tests/integration/test_infra.py
#   make test-fast  only .venv, then the tests that need no engine, registry or network (isolated)
#   make test-oldest  the same tests on the oldest Python requires-python admits: a venv of its
#                   own (.venv-oldest) from Debian 12's python3 (3.11.2), OLDEST_PYTHON to change
#   make coverage   the whole suite under coverage.py; prints builder/'s line coverage
#   make example    set up what the example needs (no registry, no arm64), then build it into
#                   ./sandbox-image
#   make lint       ruff check, ruff format --check, mypy, vulture (dead code), hadolint on
#                   Dockerfile.base, shellcheck
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

VENV        := .venv
PYTEST_ARGS ?=
STANDIN     ?= python:3.13-slim-trixie
RUNTIME     ?= sandbox-runtime:3.13-trixie

OLDEST_PYTHON ?= /usr/bin/python3
OLDEST_VENV := .venv-oldest

.PHONY: test test-fast test-oldest coverage example lint venv setup

setup:
	scripts/setup-env.sh

venv:
	scripts/setup-env.sh --venv-only

# On every core (pytest-xdist): tests/conftest.py groups the tests that use the machine, so each
# group's set-up is made once, in one worker; XDIST= runs the suite in one process.
XDIST ?= -n auto --dist loadgroup --no-loadscope-reorder

# pytest's own exit code is printed; any non-zero one fails the target (make itself then exits 2).
# Exit 5 ("no tests collected") is a failure too: a run that tests nothing must not pass.
test: setup
	@rc=0; $(VENV)/bin/pytest -q -ra --durations=25 $(XDIST) $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" -eq 5 ]; then echo "make test: pytest collected no tests (exit 5): failing" >&2; fi; \
	if [ "$$rc" -ne 0 ]; then echo "make test: pytest exited with $$rc" >&2; fi; \
	exit "$$rc"

# The whole suite under coverage.py (CLI subprocesses included): line coverage of builder/.
coverage: setup
	rm -f .coverage .coverage.*
	@rc=0; COVERAGE_FILE="$(CURDIR)/.coverage" $(VENV)/bin/coverage run -m pytest -q -ra \
		$(PYTEST_ARGS) || rc=$$?; \
	$(VENV)/bin/coverage combine -q && $(VENV)/bin/coverage report | tail -n 1; \
	exit "$$rc"

# The fast tier: every test that requests no part of the machine, isolated from all of it
# (scripts/test-fast.sh); no set-up beyond .venv. Same exit-code rules as `make test`.
test-fast: venv
	@rc=0; scripts/test-fast.sh $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" -eq 5 ]; then echo "make test-fast: pytest collected no tests (exit 5): failing" >&2; fi; \
	if [ "$$rc" -ne 0 ]; then echo "make test-fast: pytest exited with $$rc" >&2; fi; \
	exit "$$rc"

# The fast tier on requires-python's floor, the interpreter a stock Debian 12 machine gives
# setup-env.sh: what only a patch release added (tarfile's extraction filters, 3.11.4) fails
# here and nowhere else. Fails, saying so, when OLDEST_PYTHON is not of the floor.
test-oldest:
	PYTHON=$(OLDEST_PYTHON) BSI_VENV="$(CURDIR)/$(OLDEST_VENV)" scripts/setup-env.sh --venv-only
	@floor=$$(sed -n 's/^requires-python = ">=\([0-9.]*\)"$$/\1/p' pyproject.toml); \
	got=$$($(OLDEST_VENV)/bin/python -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])'); \
	if [ "$${got%.*}" != "$$floor" ]; then \
		echo "make test-oldest: error: $(OLDEST_PYTHON) is Python $$got, not of requires-python's floor $$floor" >&2; \
		exit 1; \
	fi; \
	echo "make test-oldest: Python $$got ($(OLDEST_PYTHON)), requires-python >=$$floor"; \
	rc=0; BSI_VENV=$(OLDEST_VENV) scripts/test-fast.sh $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" -eq 5 ]; then echo "make test-oldest: pytest collected no tests (exit 5): failing" >&2; fi; \
	if [ "$$rc" -ne 0 ]; then echo "make test-oldest: pytest exited with $$rc" >&2; fi; \
	exit "$$rc"

# The reference runtime base (Dockerfile.base on the stand-in), then the extension image on it:
# planned, built with BuildKit and verified hardened; the context lands in ./sandbox-image.
example:
	scripts/setup-env.sh --example
	$(VENV)/bin/build-sandbox-image base --tag $(RUNTIME) --from $(STANDIN)
	$(VENV)/bin/build-sandbox-image -r examples/requirements.txt --base-image $(RUNTIME) \
		--tag sandbox-example:latest --output sandbox-image

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture
	@files=$$(find . \( -path ./.venv -o -path ./.venv-oldest -o -path ./build \) -prune -o -name Dockerfile.base -print); \
	if [ -z "$$files" ]; then echo "hadolint: no Dockerfile.base: skipped"; fi; \
	for f in $$files; do echo "hadolint $$f"; $(VENV)/bin/hadolint "$$f"; done
	@if command -v shellcheck >/dev/null; then shellcheck scripts/*.sh .ci/run; \
	else echo "shellcheck: not installed: skipped"; fi
