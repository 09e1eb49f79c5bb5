#!/bin/bash
# bash .gpu/kit/install.sh [--dry-run]
# Reassembles $R/chunks/bundle.part-* (checked against MANIFEST), installs vLLM 0.20.0 (slim) and the wheels
# into $R/site, the project into $R/proj (kit/whl/*.whl if mkwheel.sh put one there, else a copy of
# operator/specdecode from the carried tree), copies the kit to $R/kit, writes $R/bin/vllm and
# $R/bin/specdecode, generates the models into $R/m (make-models.py) and runs the sanity checks.
# --dry-run (CPU rehearsal): pip resolves the cp312 wheels with --platform flags, the wrapper runs fakevllm.py
# (the simulator behind a vllm-like CLI), no models unless MODELS_PY names a python with tokenizers.
set -uo pipefail
DRY=${KIT_DRY:-0}; [ "${1:-}" = --dry-run ] && DRY=1
source "$(dirname "$0")/env.sh"
REPO=$(cd "$KIT_SRC/../.." && pwd)
step() { echo "== $(date -u +%T) [+$((SECONDS))s] $*"; }
fail() { echo "INSTALL FAILED: $*" >&2; exit 1; }
step "parts"
need=$(awk '$2 ~ /^bundle.part-/ {print $2}' $KIT_SRC/MANIFEST)
for n in $need; do [ -f $R/chunks/$n ] || fail "missing $R/chunks/$n (run recv.sh for it)"; done
want=$(awk '$2=="bundle.tar"{print $1}' $KIT_SRC/MANIFEST)
(cd $R/chunks && cat $need > bundle.tar) || fail "cat parts"
got=$(sha256sum $R/chunks/bundle.tar | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "bundle.tar sha256 $got != $want"
rm -rf $R/stage; mkdir -p $R/stage; tar -xf $R/chunks/bundle.tar -C $R/stage && rm -f $R/chunks/bundle.tar || fail "untar"
(cd $R/stage && sha256sum -c --quiet SHA256SUMS) || fail "a wheel in the bundle is corrupt"
step "vllm (slim) -> $R/site"
rm -rf $R/site; mkdir -p $R/site
python3 -m zipfile -e $R/stage/vllm-0.20.0-slim.zip $R/site || fail "unzip vllm"
step "wheels -> $R/site"
PLAT=""; [ $DRY = 1 ] && PLAT="--only-binary=:all: --python-version 3.12 --implementation cp $(for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_26_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 any; do printf -- '--platform %s ' $p; done)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --target $R/site $PLAT $R/stage/whl/*.whl || fail "pip install wheels"
step "project -> $R/proj"
bash $KIT_SRC/proj.sh || fail "project install"
step "kit -> $R/kit, wrappers -> $R/bin"
mkdir -p $R/bin
PY="python3 -m vllm.entrypoints.cli.main"; [ $DRY = 1 ] && PY="python3 $R/kit/fakevllm.py"
sed -e "s#@R@#$R#g" -e "s#@PP@#$KPP#" -e "s#@PY@#$PY#" $R/kit/vllm.in > $R/bin/vllm
printf '#!/bin/bash\nexport PYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH}\nexec python3 -m specdecode "$@"\n' $KPP > $R/bin/specdecode
chmod +x $R/bin/vllm $R/bin/specdecode
if [ $DRY = 1 ] && [ ! -x "$(command -v nvidia-smi)" ]; then cp $R/kit/fake-nvidia-smi $R/bin/nvidia-smi; chmod +x $R/bin/nvidia-smi; fi
step "models -> $R/m"
MPY=${MODELS_PY:-python3}
if [ $DRY = 1 ] && ! $MPY -c 'import tokenizers, transformers' 2>/dev/null; then echo "(dry run: no tokenizers here, models skipped)"
else rm -rf $R/m; $MPY $R/kit/make-models.py $R/m || fail "make-models"; ls $R/m; fi
step "sanity"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
v=$(vllm --version 2>/dev/null | tail -1); echo "vllm --version: $v"; [ "$v" = 0.20.0 ] || fail "vllm --version gave '$v'"
if [ $DRY = 0 ]; then
  python3 -c 'import vllm.entrypoints.openai.api_server, vllm.benchmarks.serve; print("vllm api_server and bench import ok")' 2>&1 | tail -3
  [ ${PIPESTATUS[0]} = 0 ] || fail "import vllm.entrypoints.openai.api_server"
fi
python3 -c 'import specdecode.cli, specdecode.local.runner; print("specdecode import ok")' || fail "import specdecode"
specdecode --version
specdecode validate $R/kit/exp/*.yaml || echo "WARNING: some experiment files do not validate (see above)"
step "preflight (the project's rendered argv through vLLM 0.20's own parser)"
python3 $R/kit/preflight.py $R/kit/exp/a-tiny-synth.yaml $R/kit/exp/b-1b-synth.yaml $R/kit/exp/c-tiny-lossless.yaml || echo "WARNING: preflight found problems (see above)"
step "install done"
