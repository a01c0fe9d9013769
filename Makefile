# Usual targets. `make ci` runs what .ci/run runs.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv install test lint typecheck fmt demo bench manifests values-schema ci clean

venv:
	python3 -m venv $(VENV)

install: venv
	$(PY) -m pip install -e '.[dev]'

test:
	$(VENV)/bin/pytest

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-logo

fmt:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck:
	$(VENV)/bin/mypy

demo:
	$(VENV)/bin/kelvin demo

bench:
	$(PY) bench/extender_latency.py
	$(PY) bench/exporter_scrape.py
	$(PY) bench/prometheus_source.py
	$(PY) bench/placement_quality.py

manifests: values-schema
	bash hack/render-manifests.sh

values-schema:
	$(PY) hack/gen-values-schema.py

ci:
	bash .ci/run

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
