# The two commands of the README. Both set everything up first (scripts/setup.sh).
.PHONY: setup demo test test-fast lint bench

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh

# Lint first (ruff and mypy, below), then the whole suite, slow end-to-end tests included
# (CI runs exactly this). One pytest-xdist worker per CPU (logical core); tests sharing an expensive
# fixture (a SLURM cluster, sshd, PostgreSQL, a trained tiny model) or a module-scoped one run on one
# worker (tests/conftest.py).
PYTEST_WORKERS ?= logical
test: lint
	@.venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope

# Style and bug patterns (ruff) and the annotations (mypy over megapilot/); settings in pyproject.toml.
lint: setup
	@.venv/bin/ruff check megapilot tests bench scripts
	@.venv/bin/python -m mypy

# Everything but the tests marked slow.
test-fast: setup
	@.venv/bin/python -m pytest -q -m "not slow" -n $(PYTEST_WORKERS) --dist loadscope
