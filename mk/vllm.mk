# vLLM's own `vllm serve` parser and config classes for the conformance tests (tests/conformance): the
# oldest and the newest supported release, each in a venv (vllm --no-deps, the few distributions its
# parser imports, a shared torch), installed from PyPI by hack/install-vllm.sh and cached per machine
# under ~/.cache/specdecode/vllm/<version>/.
# Included by the Makefile; `make test` depends on `vllm-parsers`.

VLLM_INSTALL_SCRIPT := hack/install-vllm.sh
# Where the installs are (installed or not); tests/conformance reads it and fails if one is missing.
export SPECDECODE_VLLM_DIR := $(shell bash $(VLLM_INSTALL_SCRIPT) --print-dir)

.PHONY: vllm-parsers

# Installs only what is missing: ~5 min and 7.4 GB on a fresh 2-core machine, under 1 s when cached.
vllm-parsers:
	bash $(VLLM_INSTALL_SCRIPT)
