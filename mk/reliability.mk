# Proof under load and attack: `make fuzz` runs every fuzz target of tests/fuzz at full size
# (100,000 inputs each, spread over the cores; `make test` runs each briefly), `make soak` runs
# the webhook and the extender as processes under steady load for ten minutes. Figures of the
# last runs are in RELIABILITY.md.

PYTHON ?= .venv/bin/python
FUZZ_EXAMPLES ?= 100000
SOAK_SECONDS ?= 600

.PHONY: fuzz soak

fuzz: install
	$(PYTHON) tools/fuzz.py --examples $(FUZZ_EXAMPLES)

soak: install
	$(PYTHON) bench/soak.py --seconds $(SOAK_SECONDS)
