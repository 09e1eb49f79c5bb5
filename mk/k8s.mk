# The real components the e2e tests start: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm, Prometheus and the Prometheus Operator, all built from the Go module proxy by
# hack/build-k8s-bins.sh and cached per machine under ~/.cache/specdecode/k8s-bins/<versions>/.
# (Debian's prometheus package is not used: it is built without kubernetes_sd_configs.)
# Included by the Makefile; `make test` depends on `k8s-bins`.

K8S_BUILD_SCRIPT := hack/build-k8s-bins.sh
# Where the binaries are (built or not); the e2e fixtures read it and fail if one is missing.
export SPECDECODE_K8S_BIN_DIR := $(shell bash $(K8S_BUILD_SCRIPT) --print-dir)
PYTEST ?= $(BIN)/pytest

.PHONY: k8s-bins test-e2e

# Builds only what is missing: ~12 min on a fresh 2-core machine, under 1 s when cached.
k8s-bins:
	bash $(K8S_BUILD_SCRIPT)

test-e2e: k8s-bins
	$(PYTEST) tests/e2e
