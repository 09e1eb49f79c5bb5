# The two commands of the README: `make demo` and `make test`. Each creates or refreshes .venv.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-deps lint typecheck unit crd venv clean lock

venv: $(STAMP)

# What the demo needs: the package and its runtime dependencies only.
RUNTIME_STAMP := $(VENV)/.installed-runtime

# Reinstall when the dependency list changes. The dev toolchain includes the runtime.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@ $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@touch $@

demo: $(RUNTIME_STAMP)
	$(BIN)/specdecode demo --out demo-out
	@echo "specdecode and kubectl-specdecode are in $(BIN)/: run $(BIN)/specdecode, or put them on PATH with: source $(BIN)/activate"

lint: $(STAMP)
	$(BIN)/ruff check operator tests benchmarks
	$(BIN)/ruff format --check operator tests benchmarks
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Regenerate the CRD (and the chart's copy) from the typed models.
crd: $(STAMP)
	$(BIN)/python -m specdecode.experiment.crd > crds/specdecodeexperiments.specdecode.io.yaml
	cp crds/specdecodeexperiments.specdecode.io.yaml charts/specdecode-operator/crds/

# The image's dependencies, pinned with hashes (Dockerfile: pip --require-hashes). Rerun after
# changing [project].dependencies; uv resolves for every platform and every Python the project supports (--universal, from 3.11).
lock: $(STAMP)
	$(BIN)/python -m pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --generate-hashes --universal --python-version 3.11 \
	  --no-header -o requirements.lock

unit: $(STAMP)
	$(BIN)/pytest -q

# What the tests need, installed side by side (hack/test-deps.sh): a cold machine's Go build and
# downloads overlap. Each is a no-op when cached; the targets below still name each one.
test-deps:
	MAKE="$(MAKE)" bash hack/test-deps.sh

test: test-deps
	$(MAKE) --no-print-directory lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The real control plane, KWOK, helm and Prometheus for the e2e tests (built once per machine).
include mk/k8s.mk
unit: k8s-bins
# vLLM's own CLI parser, oldest and newest supported release, for the conformance tests.
include mk/vllm.mk
unit: vllm-parsers
# s3proxy (Java, from Maven Central) for the S3 results store's tests.
include mk/s3proxy.mk
unit: s3proxy
