#!/bin/bash
# HERE, before a device call: builds the project's wheel from the working tree into .gpu/kit/whl/ (carried
# with the kit; install.sh / proj.sh install it into $R/proj). Without a wheel they copy operator/specdecode
# from the carried tree instead. Build outputs go to a temp dir, so the tree's build/ and *.egg-info stay clean.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu/kit/whl; mkdir -p .gpu/kit/whl
tmp=$(mktemp -d); git ls-files -z | xargs -0 -I{} cp --parents {} $tmp/ 2>/dev/null || true
cp -r operator $tmp/   # untracked new modules too
(cd $tmp && python3 -m pip wheel -q --no-deps -w "$OLDPWD/.gpu/kit/whl" .)
rm -rf $tmp
ls -la .gpu/kit/whl
python3 -c "import zipfile,sys; n=zipfile.ZipFile(sys.argv[1]).namelist(); print(len(n),'files;', [x for x in n if x.endswith(('.jsonl','.yaml'))][:6])" .gpu/kit/whl/*.whl
