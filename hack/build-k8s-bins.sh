#!/usr/bin/env bash
# Build the Kubernetes test binaries from the Go module proxy (no Docker, no GitHub downloads).
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  (k8s.io/kubernetes, helper module)
#   etcd, etcdctl                                                    (go.etcd.io/etcd, helper module)
#   kwok                                                             (go install)
#   helm                                                             (go install)
#   prometheus (kubernetes_sd only; Debian's package has no kubernetes_sd) (go install)
#   prometheus-operator and its CRDs (prometheus-operator-crds/)     (a copy of its module, go build)
#
# Binaries go to ${XDG_CACHE_HOME:-$HOME/.cache}/specdecode/k8s-bins/<kube>-<etcd>-<kwok>-<helm>-<prometheus>/.
# Only missing binaries are built. Progress and timings go to stderr; the last line of
# stdout is the bin dir.
#
# Usage: hack/build-k8s-bins.sh             build what is missing, print the bin dir
#        hack/build-k8s-bins.sh --print-dir print the bin dir only (builds nothing)
#        hack/build-k8s-bins.sh --check     exit 1 if a binary is missing (builds nothing)
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.21.4}"
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"  # Prometheus 3.16.0 (its Go module is tagged v0.3XX.y)
# The Prometheus Operator (kube-prometheus-stack's) and its CRDs, for the chart's PodMonitors.
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
# Kubernetes 1.36 needs Go >= 1.26: an older go (>= 1.21) runs this toolchain instead, which it
# fetches from the Go module proxy itself (golang.org/toolchain; see `go help toolchain`).
GO_TOOLCHAIN="${GO_TOOLCHAIN:-go1.26.8}"

CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/specdecode/k8s-bins"
BIN_DIR="$CACHE_ROOT/${KUBE_VERSION}-${ETCD_VERSION}-${KWOK_VERSION}-${HELM_VERSION}-${PROMETHEUS_VERSION}"
KUBE_BINS=(kube-apiserver kube-controller-manager kube-scheduler)
ALL_BINS=("${KUBE_BINS[@]}" kubectl etcd etcdctl kwok helm prometheus prometheus-operator)
# Files beside the binaries (fetched, not built).
PO_CRDS="prometheus-operator-crds"
PO_CRD_MARK="$PO_CRDS/monitoring.coreos.com_podmonitors.yaml"  # one CRD file that says the set is there
ALL_FILES=(kwok-stages.yaml "$PO_CRD_MARK")

log() { printf '[build-k8s-bins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

missing() {
  local b out=()
  for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || out+=("$b"); done
  echo "${out[@]:-}"
}

missing_files() {
  local f out=()
  for f in "${ALL_FILES[@]}"; do [[ -f "$BIN_DIR/$f" ]] || out+=("$f"); done
  echo "${out[@]:-}"
}

case "${1:-}" in
  --print-dir) echo "$BIN_DIR"; exit 0 ;;
  --check)
    m="$(missing "${ALL_BINS[@]}") $(missing_files)"
    if [[ -n "${m// /}" ]]; then echo "missing in $BIN_DIR: $m" >&2; exit 1; fi
    echo "$BIN_DIR"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-dir|--check]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { [[ -x /usr/local/go/bin/go ]] && export PATH="/usr/local/go/bin:$PATH"; }
command -v go >/dev/null || { echo "go not found (need Go >= 1.26, or >= 1.21 to fetch $GO_TOOLCHAIN)" >&2; exit 1; }
if [[ -z "${GOTOOLCHAIN:-}" ]]; then
  GO_HAVE="$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null || echo unknown)"
  GO_MINOR="$(sed -nE 's/^go1\.([0-9]+)([^0-9].*)?$/\1/p' <<<"$GO_HAVE")"
  if [[ -z "$GO_MINOR" || "$GO_MINOR" -lt 21 ]]; then
    echo "go $GO_HAVE is too old: install Go >= 1.26 (or >= 1.21, which fetches $GO_TOOLCHAIN itself)" >&2
    exit 1
  elif [[ "$GO_MINOR" -lt 26 ]]; then
    log "go $GO_HAVE is older than 1.26: building with $GO_TOOLCHAIN from the Go module proxy (GOTOOLCHAIN)"
    export GOTOOLCHAIN="$GO_TOOLCHAIN"
  fi
fi

mkdir -p "$BIN_DIR"
# One build at a time per cache dir (make and pytest may both call this).
exec 9>"$BIN_DIR/.lock"
flock 9

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/k8s-bins.XXXXXX")"
mkdir -p "$WORK/out"
trap 'rm -rf "$WORK"' EXIT
TOTAL_START=$SECONDS

timed() { # timed LABEL CMD...
  local label="$1" t0=$SECONDS; shift
  log "building $label ..."
  "$@"
  log "built $label in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- Kubernetes
kube_module() { # prepare the helper module in $WORK/kube once
  [[ -f "$WORK/kube/go.mod" ]] && return 0
  mkdir -p "$WORK/kube"
  (
    cd "$WORK/kube"
    go mod init specdecode.test/k8s-bins >/dev/null 2>&1
    local gomod sv kgo
    gomod="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    sv="v0.${KUBE_VERSION#v1.}"
    kgo="$(go mod edit -json "$gomod" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Go"])')"
    # Every k8s.io module that k/k replaces with ./staging/... or requires at v0.0.0.
    local staging
    staging="$(go mod edit -json "$gomod" | python3 -c '
import json, sys
m = json.load(sys.stdin)
names = {r["Old"]["Path"] for r in m.get("Replace") or []
         if r["New"]["Path"].startswith("./staging/")}
names |= {r["Path"] for r in m.get("Require") or [] if r["Version"] == "v0.0.0"}
print("\n".join(sorted(n for n in names if n.startswith("k8s.io/"))))')"
    log "k8s.io/kubernetes $KUBE_VERSION: go $kgo, $(wc -l <<<"$staging") staging modules -> $sv"
    go mod edit -go="$kgo"
    local n args=()
    for n in $staging; do args+=("-replace=$n=$n@$sv"); done
    go mod edit "${args[@]}"
    local t tools=()
    for t in "${KUBE_BINS[@]}" kubectl; do tools+=("k8s.io/kubernetes/cmd/$t@$KUBE_VERSION"); done
    go get -tool "${tools[@]}" >&2
  )
}

kube_ldflags() {
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local date; date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local pkg f=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "-s -w$f"
}

build_kube() { # build_kube BIN... (one go build: they share most packages)
  kube_module
  local pkgs=() b
  for b in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  mkdir -p "$WORK/out"
  (cd "$WORK/kube" && go build -trimpath -tags=selinux,notest,grpcnotrace \
     -ldflags="$(kube_ldflags)" -o "$WORK/out/" "${pkgs[@]}")
  for b in "$@"; do mv -f "$WORK/out/$b" "$BIN_DIR/$b"; done
}

# ---------------------------------------------------------------- etcd
build_etcd() {
  mkdir -p "$WORK/etcd" "$WORK/out"
  (
    cd "$WORK/etcd"
    go mod init specdecode.test/etcd-bins >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION" >&2
    go build -trimpath -ldflags="-s -w" -o "$WORK/out/etcd" go.etcd.io/etcd/server/v3
    go build -trimpath -ldflags="-s -w" -o "$WORK/out/etcdctl" go.etcd.io/etcd/etcdctl/v3
  )
  mv -f "$WORK/out/etcd" "$WORK/out/etcdctl" "$BIN_DIR/"
}

# ---------------------------------------------------------------- kwok, helm
build_kwok() {
  GOBIN="$WORK/out" go install -trimpath -ldflags="-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv -f "$WORK/out/kwok" "$BIN_DIR/kwok"
}

helm_kube_flags() { # helm v3 defaults .Capabilities.KubeVersion to v1.20 unless told
  [[ "$1" == v3 ]] || return 0
  local minor="${KUBE_VERSION#v1.}" p f=""
  minor="${minor%%.*}"
  for p in pkg/chartutil pkg/lint/rules; do
    f+=" -X helm.sh/helm/v3/$p.k8sVersionMajor=1 -X helm.sh/helm/v3/$p.k8sVersionMinor=$minor"
  done
  echo "$f"
}

# kwok needs Stage definitions; take kwokctl's default set from the same module version.
build_kwok_stages() {
  local dir f
  dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  {
    printf '# kwokctl default stages from sigs.k8s.io/kwok@%s (kustomize/stage)\n' "$KWOK_VERSION"
    # No KwokConfiguration document: one read from a file is not defaulted (v0.8.0 then fails with
    # "node leases parallelism must be greater than 0"); without one, kwok uses its defaults.
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      echo '---'; cat "$dir/kustomize/stage/$f"
    done
  } > "$WORK/out/kwok-stages.yaml"
  mv -f "$WORK/out/kwok-stages.yaml" "$BIN_DIR/kwok-stages.yaml"
}

build_helm() {
  local major="${HELM_VERSION%%.*}"
  GOBIN="$WORK/out" go install -trimpath \
    -ldflags="-s -w -X helm.sh/helm/$major/internal/version.version=$HELM_VERSION $(helm_kube_flags "$major")" \
    "helm.sh/helm/$major/cmd/helm@$HELM_VERSION"
  mv -f "$WORK/out/helm" "$BIN_DIR/helm"
}

# Prometheus with only the kubernetes (and file/http) service discovery compiled in, and no web UI
# assets (the HTTP API is all the tests use).
build_prometheus() {
  local v="${PROMETHEUS_VERSION#v0.}" pv
  pv="3.$((10#${v%%.*} - 300)).${v#*.}"  # v0.316.0 -> 3.16.0
  GOBIN="$WORK/out" go install -trimpath -tags=netgo,remove_all_sd,enable_kubernetes_sd \
    -ldflags="-s -w -X github.com/prometheus/common/version.Version=$pv -X github.com/prometheus/common/version.Branch=$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
  mv -f "$WORK/out/prometheus" "$BIN_DIR/prometheus"
}

# The Prometheus Operator's own binary and CRDs, both from its Go module. Its go.mod replaces its two
# nested modules (pkg/apis/monitoring, pkg/client) by directories a module zip does not contain, so it is
# built from a copy of the module with those replaces dropped (the same versions come from the proxy).
build_prometheus_operator() {
  local dir
  dir="$(go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  cp -r "$dir" "$WORK/prometheus-operator" && chmod -R u+w "$WORK/prometheus-operator"
  (
    cd "$WORK/prometheus-operator"
    go mod edit -dropreplace=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring \
      -dropreplace=github.com/prometheus-operator/prometheus-operator/pkg/client
    go build -trimpath -ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" \
      -o "$WORK/out/prometheus-operator" ./cmd/operator
  )
  rm -rf "${BIN_DIR:?}/$PO_CRDS" && cp -r "$dir/example/prometheus-operator-crd" "$BIN_DIR/$PO_CRDS"
  chmod -R u+w "$BIN_DIR/$PO_CRDS"
  mv -f "$WORK/out/prometheus-operator" "$BIN_DIR/prometheus-operator"
}

log "bin dir: $BIN_DIR (go: $(go version | cut -d' ' -f3), $(nproc) cores)"
m="$(missing etcd etcdctl)";   [[ -z "$m" ]] || timed "etcd $ETCD_VERSION (etcd, etcdctl)" build_etcd
m="$(missing "${KUBE_BINS[@]}")"
# shellcheck disable=SC2086
[[ -z "$m" ]] || timed "kubernetes $KUBE_VERSION ($m)" build_kube $m
m="$(missing kwok)";           [[ -z "$m" ]] || timed "kwok $KWOK_VERSION" build_kwok
[[ -f "$BIN_DIR/kwok-stages.yaml" ]] || timed "kwok stages" build_kwok_stages
m="$(missing kubectl)";        [[ -z "$m" ]] || timed "kubectl $KUBE_VERSION" build_kube kubectl
m="$(missing helm)";           [[ -z "$m" ]] || timed "helm $HELM_VERSION" build_helm
m="$(missing prometheus)";     [[ -z "$m" ]] || timed "prometheus $PROMETHEUS_VERSION" build_prometheus
m="$(missing prometheus-operator)"; [[ -f "$BIN_DIR/$PO_CRD_MARK" ]] || m+=" $PO_CRD_MARK"
[[ -z "${m// /}" ]] || timed "prometheus-operator $PROMETHEUS_OPERATOR_VERSION (and its CRDs)" build_prometheus_operator

m="$(missing "${ALL_BINS[@]}") $(missing_files)"
if [[ -n "${m// /}" ]]; then log "still missing: $m"; exit 1; fi
{
  "$BIN_DIR/kube-apiserver" --version
  "$BIN_DIR/kubectl" version --client 2>/dev/null | head -1
  "$BIN_DIR/etcd" --version | head -1
  "$BIN_DIR/kwok" --version 2>/dev/null | head -1 || true
  "$BIN_DIR/helm" version --short
  "$BIN_DIR/prometheus" --version | head -1
  "$BIN_DIR/prometheus-operator" --version | head -1
} >&2 || true
log "done in $((SECONDS - TOTAL_START)) s"
echo "$BIN_DIR"
