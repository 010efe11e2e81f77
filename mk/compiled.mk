# The build the image ships: the modules pyproject.toml lists under [tool.tmi] compiled, compiled
# with mypyc (setup.py), installed with the rest of tmi into build/compiled. `test-compiled` runs
# the unit, integration and fuzz tiers against it (tests/unit/test_compiled.py proves which build
# a run imported); `make bench` measures it.

COMPILED_DIR := build/compiled
# Every file of the packages the wheel holds, tracked or not (a new module counts at once).
COMPILED_INPUTS := setup.py pyproject.toml uv.lock mk/compiled.mk \
	$(shell find inference_policy policy_io serving webhook extender allocation_controller tmi_cli \
		-type f -not -path '*/__pycache__/*' 2>/dev/null)

.PHONY: compiled test-compiled

compiled: $(COMPILED_DIR)/.built

$(COMPILED_DIR)/.built: .venv/.installed $(COMPILED_INPUTS)
	@# setuptools reuses build/lib.*: a module dropped from the list would ship compiled still.
	rm -rf build/wheel build/lib.* build/temp.* build/bdist.* $(COMPILED_DIR)
	TMI_COMPILE=1 uv build --quiet --wheel --no-build-isolation --python $(PYTHON) -o build/wheel
	uv pip install --quiet --no-deps --python $(PYTHON) --target $(COMPILED_DIR) build/wheel/tmi-*.whl
	@# The harness reads the checkout (the chart, manifests, examples, tools/k8sbin) beside its own
	@# package, so it runs from there: a copy here would look for them under build/compiled.
	rm -rf $(COMPILED_DIR)/localcluster
	@touch $@

# Append mode and the compiled build first on the path: pytest's default prepend mode would put
# the source tree ahead of it again for every test package. PYTHONPATH carries it to the server
# processes the tests start (`python -P -m webhook`).
test-compiled: compiled
	PYTHONPATH=$(abspath $(COMPILED_DIR)) TMI_EXPECT_COMPILED=1 $(PYTEST) -p no:cacheprovider \
		--import-mode=append -o pythonpath="$(COMPILED_DIR) ." tests/unit tests/integration tests/fuzz
