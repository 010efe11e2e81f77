# The two commands a newcomer needs are `make demo` and `make test`; everything else is a step
# of those two. The control-plane binaries are built once into a versioned cache outside the
# checkout (see tools/k8sbin/build.sh) and reused by every later run.

PYTHON := .venv/bin/python
PYTEST := .venv/bin/pytest

.PHONY: all install test check lint typecheck importlint test-unit test-integration test-e2e \
        demo bench certs clean help

all: test

help:
	@echo "make demo     - run the demo on a local control plane (builds binaries on first use)"
	@echo "make test     - lint, type-check and run every test tier"
	@echo "make bench    - run the benchmarks and the research replays, refresh bench/results"

install: .venv/.installed

.venv/.installed: pyproject.toml uv.lock tools/bootstrap.sh
	tools/bootstrap.sh
	@touch $@

check: lint typecheck importlint

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

typecheck: install
	.venv/bin/mypy

importlint: install
	.venv/bin/lint-imports

test-unit: install
	$(PYTEST) tests/unit

test-integration: install
	$(PYTEST) tests/integration

test: install controlplane node node-tools-test check
	$(PYTEST) tests

demo: install controlplane node
	$(PYTHON) -m localcluster.demo

# The product's benchmarks, then the research replays (bench/research: placement policies compared
# offline on a trace, not the product as users meet it).
BENCHES := $(sort $(wildcard bench/bench_*.py)) $(sort $(wildcard bench/research/bench_*.py))

bench: install controlplane
	@for script in $(BENCHES); do echo "== $$script"; $(PYTHON) $$script || exit 1; done

certs: install
	$(PYTHON) certs/make-dev-certs.py certs

clean:
	rm -rf build .venv .mypy_cache .ruff_cache .pytest_cache .hypothesis .artifacts

-include mk/*.mk
