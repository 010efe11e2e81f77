# Local Kubernetes control plane for e2e tests and the demo.
#
# `make controlplane` builds etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
# kwok, helm, kustomize and tmi-oci from the Go module proxy into
# ~/.cache/tmi/k8sbin/<versions>/ (or $TMI_K8S_BIN_DIR); it is a no-op when they are already
# there, so CI can cache that directory.
# `make node` builds what the real node runs (kubelet, kube-proxy, containerd, runc, the CNI
# plugins, the simulated GPUs' device plugin) into ~/.cache/tmi/nodebin/<versions>/ the same
# way (tools/k8sbin/build-node.sh; $TMI_NODE_BIN_DIR overrides), and the simulated GPUs' DRA
# kubelet plugin into ~/.cache/tmi/fakedra/<sources>/ (tools/k8sbin/build-fakedra.sh).
# Each build prints, per component on standard error, its turn, the time spent and an estimate of
# the time left, from the last build's times (~/.cache/tmi/build-times.json, or $TMI_CACHE_DIR)
# else typical figures (localcluster/plane/build_progress.py).
# `make test-e2e` runs the tests against it; component logs of failed tests are copied
# to .artifacts/<test>/.

PYTHON ?= .venv/bin/python
PYTEST ?= .venv/bin/pytest

.PHONY: controlplane node node-tools-test test-e2e test-versions demo-guard

controlplane:
	tools/k8sbin/build.sh

node:
	tools/k8sbin/build-node.sh
	tools/k8sbin/build-fakedra.sh

# The node tools' own tests (the simulated GPUs' device plugin against a kubelet stand-in).
node-tools-test:
	PATH=/usr/local/go/bin:$$PATH GOTOOLCHAIN=local GOFLAGS=-mod=readonly go -C tools/k8sbin/nodetools test ./...
	PATH=/usr/local/go/bin:$$PATH GOTOOLCHAIN=local GOFLAGS=-mod=readonly go -C tools/k8sbin/fakedra test ./...

test-e2e: node
	$(PYTEST) tests/e2e -m e2e

# First demo step: plane up, fake GPU nodes, the pod guard refusing a privileged pod.
demo-guard:
	$(PYTHON) -m localcluster.demo.guard

# The chart on every Kubernetes minor from the guard's floor to the newest the Go module proxy
# serves (localcluster/install/version_check.py): each release's kube-apiserver and kube-scheduler are
# built once into ~/.cache/tmi/release/<version>/ (about five minutes each on two cores), the
# chart dry-run there and the whole stack probed on them (about a minute each), and the results
# land in docs/compatibility.md. Not part of `make test`: the pinned release runs the e2e suite.
K8S_RANGE ?= v1.30.14 v1.31.14 v1.32.13 v1.33.13 v1.34.4 v1.35.4 v1.36.3 v1.37.2

test-versions: install controlplane
	$(PYTHON) -m localcluster.install.version_check $(K8S_RANGE)
