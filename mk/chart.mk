# The Helm chart (charts/tmi) and what is generated from it: the kustomize bases under
# manifests/ and the guard's CEL expression. `make chart` regenerates them after a change to
# the chart or to inference_policy.base.access; tests/chart fails while they are stale.

.PHONY: chart chart-lint

chart: install controlplane
	$(PYTHON) -m chart_tools.generate

chart-lint: install controlplane
	$(PYTEST) tests/chart
