#!/bin/bash
# Runs HERE (CPU machine), not on the GPU: slims the vLLM 0.20.0 wheel, bundles it with the other wheels
# from wheels/ (fetch-wheels.py output) and splits the bundle into carry-sized parts under parts/.
#   bash .gpu/build.sh            # -> .gpu/parts/bundle.part-aa ... + .gpu/kit/MANIFEST (sha256 of parts + tar)
# PART_SIZE (default 52M) as split -b takes it.
set -euo pipefail
G=$(cd "$(dirname "$0")" && pwd); cd "$G"
PART_SIZE=${PART_SIZE:-52M}
W=$(ls wheels/vllm-0.20.0-*.whl)
mkdir -p build; rm -rf build/stage parts; mkdir -p build/stage/whl parts
python3 - "$W" build/stage/vllm-0.20.0-slim.zip <<'PY'
import sys, zipfile
src, dst = sys.argv[1:]
DROP = {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_flashmla_C.abi3.so"}
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
    names = zin.namelist()
    assert DROP <= set(names), DROP - set(names)
    for info in zin.infolist():
        if info.filename in DROP:
            continue
        zout.writestr(info, zin.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
print("slim zip written")
PY
for w in wheels/*.whl; do case "$w" in wheels/vllm-*) ;; *) cp "$w" build/stage/whl/ ;; esac; done
# one version per distribution, or pip --no-deps --target stops
dups=$(ls build/stage/whl | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dups" ] || { echo "duplicate wheels: $dups" >&2; exit 1; }
(cd build/stage && sha256sum vllm-0.20.0-slim.zip whl/*.whl > SHA256SUMS)
tar -C build/stage -cf build/bundle.tar .
split -b "$PART_SIZE" -a 2 build/bundle.tar parts/bundle.part-
{ echo "# sha256  file   (bundle.tar = cat parts in name order)"
  (cd parts && sha256sum bundle.part-*); sha256sum build/bundle.tar | sed 's#build/##'; } > kit/MANIFEST
ls -la build/stage/vllm-0.20.0-slim.zip build/bundle.tar parts/; cat kit/MANIFEST
