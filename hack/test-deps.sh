#!/usr/bin/env bash
# Install what `make test` needs that is built or downloaded once per machine, all at once: on a cold
# machine the Go build of the Kubernetes binaries is CPU-bound while the vLLM install, the s3proxy jar
# and the project's venv mostly wait on the package registries, so side by side they take about as long
# as the Go build alone (one after the other they added up). Each one's output is prefixed with its
# name; the exit status is the first failure's (the others are let finish: what they built is cached).
#
# Usage: hack/test-deps.sh            (the Makefile's `test-deps`; MAKE names make for the venv)
set -uo pipefail
cd "$(dirname "$0")/.."

names=(venv k8s-bins vllm-parsers s3proxy)
commands=(
  "${MAKE:-make} --no-print-directory venv"
  "bash hack/build-k8s-bins.sh"
  "bash hack/install-vllm.sh"
  "bash hack/build-s3proxy.sh"
)

pids=()
for i in "${!names[@]}"; do
  (
    set -o pipefail
    ${commands[$i]} 2>&1 | sed -u "s/^/[${names[$i]}] /"
  ) &
  pids+=($!)
done

status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "[test-deps] ${names[$i]} failed: run \`${commands[$i]}\` alone to see why" >&2
    [[ $status -ne 0 ]] || status=1
  fi
done
exit "$status"
