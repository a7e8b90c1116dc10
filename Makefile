# The two commands of the README. Both set everything up first (scripts/setup.sh).
.PHONY: setup demo test test-slow test-all lint

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

# Lint first (ruff and mypy, below), then every test not marked slow: under 10 minutes on 2 cores.
# The slow end-to-end tests (real training in many layouts, SLURM, sshd, Chromium) are `make test-slow`;
# CI runs both (.ci/run). One pytest-xdist worker per CPU (logical core); tests sharing an expensive
# fixture (a SLURM cluster, sshd, PostgreSQL, a trained tiny model) or a module-scoped one run on one
# worker (tests/conftest.py).
PYTEST_WORKERS ?= logical
PYTEST = .venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope
test: lint
	@$(PYTEST) -m "not slow"

test-slow: setup
	@$(PYTEST) -m slow

test-all: lint
	@$(PYTEST)

# Style and bug patterns (ruff) and the annotations (mypy over megapilot/); settings in pyproject.toml.
lint: setup
	@.venv/bin/ruff check megapilot tests bench scripts
	@.venv/bin/python -m mypy

