#!/usr/bin/env bash
# Install vLLM's own `vllm serve` parser and config classes, without a GPU, for the conformance tests
# (tests/conformance): the oldest and the newest supported vLLM release, each in its own venv.
#
#   vllm==<version> --no-deps            the release's own code (the wheel also carries its CUDA kernels,
#                                        unused here)
#   + the distributions importing `vllm.entrypoints.cli.serve`, `vllm.engine.arg_utils` and
#     `vllm.config.SpeculativeConfig` needs (PARSER_DEPS below), at the versions that release's own
#     requirements allow
#   + torch, shared by every release through a .pth file: PyPI's Linux torch wheel is the CUDA build and
#     `import torch` loads the CUDA libraries even without a GPU, so those come along; triton (900 MB,
#     never imported without a GPU) does not.
#
# Layout: ${XDG_CACHE_HOME:-$HOME/.cache}/specdecode/vllm/
#           torch-<torch>-py<XY>/ pip --target: torch and the CUDA libraries its import loads
#           <version>/venv/       one venv per vLLM release; <version>/.installed marks it complete
# Only what is missing is installed. Progress and timings go to stderr; the last line of stdout is the
# cache dir.
#
# Usage: hack/install-vllm.sh              install what is missing, print the cache dir
#        hack/install-vllm.sh --print-dir  print the cache dir only (installs nothing)
#        hack/install-vllm.sh --check      exit 1 if a release is missing (installs nothing)
set -euo pipefail

# Oldest and newest supported releases (README: supported range). 0.20.0 is the release the GPU recipe runs.
VLLM_VERSIONS="${VLLM_VERSIONS:-0.20.0 0.33.0}"
# vLLM 0.33.0 pins torch 2.14.0; the parsers of every release 0.20.0-0.33.0 import with it.
TORCH_VERSION="${TORCH_VERSION:-2.14.0}"
PYTHON="${PYTHON:-python3}"

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/specdecode/vllm"

# What `import vllm.entrypoints.cli.serve` (and the engine args / SpeculativeConfig) imports at module
# level, by distribution name as vLLM's requirements spell them; a name a release does not require is
# skipped for it. Found by importing each release in an empty venv until it imported.
PARSER_DEPS=(
  aiohttp anthropic apache-tvm-ffi blake3 cachetools cbor2 cloudpickle fastapi gguf ijson llguidance
  mistral_common model-hosting-container-standards msgspec numpy openai openai-harmony oss-harmony orjson
  partial-json-parser pillow prometheus_client prometheus-fastapi-instrumentator psutil py-cpuinfo pybase64
  pydantic pyyaml pyzmq regex requests sentencepiece setproctitle tiktoken transformers uvloop watchfiles
  xgrammar
)
# Resolved with the rest (so the versions fit), but not installed: the GPU side of torch's requirements.
NOT_INSTALLED_RE='^(torch|triton|nvidia-.*|cuda-.*)$'

log() { printf '[install-vllm %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

PY_TAG="$("$PYTHON" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')"
TORCH_DIR="$CACHE_ROOT/torch-$TORCH_VERSION-$PY_TAG"
# An install is current when its stamp matches what this script would install now.
STAMP="python=$PY_TAG torch=$TORCH_VERSION deps=${PARSER_DEPS[*]} not=$NOT_INSTALLED_RE"
current() { [[ -f "$1/.installed" && "$(cat "$1/.installed")" == "$STAMP" ]]; }

case "${1:-}" in
  --print-dir) echo "$CACHE_ROOT"; exit 0 ;;
  --check)
    m=""
    for v in $VLLM_VERSIONS; do current "$CACHE_ROOT/$v" || m+=" $v"; done
    if [[ -n "$m" ]]; then echo "vLLM not installed in $CACHE_ROOT:$m (run hack/install-vllm.sh)" >&2; exit 1; fi
    echo "$CACHE_ROOT"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

mkdir -p "$CACHE_ROOT"
# One install at a time per cache dir (make and a test may both call this).
exec 9>"$CACHE_ROOT/.lock"
flock 9
TOTAL_START=$SECONDS
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# requirements FILE NAME... : the Requires-Dist lines of a METADATA file for the given names (no extras).
requirements() {
  "$PYTHON" - "$@" <<'PY'
import re, sys
path, *names = sys.argv[1:]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
wanted = {norm(n) for n in names}
for line in open(path, encoding="utf-8"):
    if not line.startswith("Requires-Dist:"):
        continue
    req = line.split(":", 1)[1].strip()
    if "extra ==" in req:
        continue
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req).group(0)
    if norm(name) in wanted:
        print(req)
PY
}

install_torch() {
  local t0=$SECONDS tmp
  log "installing torch $TORCH_VERSION and the CUDA libraries its import loads into $TORCH_DIR ..."
  tmp="$(mktemp -d "$CACHE_ROOT/.torch.XXXXXX")"
  "$PYTHON" -m pip install -q --no-deps --only-binary=:all: --target "$tmp" "torch==$TORCH_VERSION"
  # torch's own requirements, less triton (the GPU compiler) and setuptools (the venv has one); pip
  # resolves them into the same dir.
  local reqs=()
  mapfile -t reqs < <(requirements "$(echo "$tmp"/torch-*.dist-info/METADATA)" \
    filelock typing-extensions sympy networkx jinja2 fsspec cuda-toolkit cuda-bindings \
    nvidia-cudnn-cu13 nvidia-cusparselt-cu13 nvidia-nccl-cu13 nvidia-nvshmem-cu13)
  "$PYTHON" -m pip install -q --upgrade --only-binary=:all: --target "$tmp" "${reqs[@]}"
  rm -rf "$TORCH_DIR"
  mv "$tmp" "$TORCH_DIR"
  log "installed torch in $((SECONDS - t0)) s ($(du -sh "$TORCH_DIR" | cut -f1))"
}

install_vllm() { # install_vllm VERSION
  local v="$1" t0=$SECONDS dir="$CACHE_ROOT/$1"
  log "installing vLLM $v into $dir ..."
  rm -rf "$dir"
  mkdir -p "$dir"
  "$PYTHON" -m venv "$dir/venv"
  local py="$dir/venv/bin/python" site
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$TORCH_DIR" > "$site/specdecode-shared-torch.pth"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q --no-deps --only-binary=:all: "vllm==$v"
  local meta reqs=() pins=()
  meta="$(echo "$site"/vllm-"$v".dist-info/METADATA)"
  mapfile -t reqs < <(requirements "$meta" "${PARSER_DEPS[@]}")
  # Resolve as pip would (torch is seen in the shared dir), then install all but the GPU side.
  "$py" -m pip install -q --dry-run --only-binary=:all: --report "$dir/resolved.json" "${reqs[@]}"
  mapfile -t pins < <("$PYTHON" - "$dir/resolved.json" "$NOT_INSTALLED_RE" <<'PY'
import json, re, sys
report, skip = json.load(open(sys.argv[1])), re.compile(sys.argv[2])
for item in report["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if skip.match(re.sub(r"[-_.]+", "-", name).lower()):
        print(f"not installing {name}=={version}", file=sys.stderr)
    else:
        print(f"{name}=={version}")
PY
)
  "$py" -m pip install -q --no-deps --only-binary=:all: "${pins[@]}"
  # The proof: the release's serve parser builds (tests/conformance/vllm_check.py does the rest).
  "$py" - "$v" <<'PY' >&2
import sys
from vllm import platforms
from vllm.platforms.cpu import CpuPlatform
platforms.current_platform = CpuPlatform()
import vllm
from vllm.config import SpeculativeConfig  # noqa: F401
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: F401
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())
assert vllm.__version__ == sys.argv[1], vllm.__version__
print(f"vllm {vllm.__version__}: serve parser builds")
PY
  echo "$STAMP" > "$dir/.installed"
  log "installed vLLM $v in $((SECONDS - t0)) s ($(du -sh "$dir" | cut -f1))"
}

log "cache dir: $CACHE_ROOT ($("$PYTHON" --version), $(nproc) cores)"
current "$TORCH_DIR" || { install_torch && echo "$STAMP" > "$TORCH_DIR/.installed"; }
for v in $VLLM_VERSIONS; do
  current "$CACHE_ROOT/$v" || install_vllm "$v"
done
log "done in $((SECONDS - TOTAL_START)) s ($(du -sh "$CACHE_ROOT" | cut -f1) in $CACHE_ROOT)"
echo "$CACHE_ROOT"
