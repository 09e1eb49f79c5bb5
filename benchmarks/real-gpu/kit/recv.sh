#!/bin/bash
# bash .gpu/kit/recv.sh aa [ab ...]   -- in the call that carries .gpu/parts/bundle.part-aa (and .gpu/kit):
# checks each carried part against MANIFEST and copies it to $R/chunks/ (the carried copy is gone next call).
set -uo pipefail
source "$(dirname "$0")/env.sh"
G=$(cd "$KIT_SRC/.." && pwd); mkdir -p $R/chunks; t0=$SECONDS; bad=0
for p in "$@"; do
  f=$G/parts/bundle.part-$p
  want=$(awk -v n="bundle.part-$p" '$2==n{print $1}' "$KIT_SRC/MANIFEST")
  if [ ! -f "$f" ]; then echo "recv: $f not carried" >&2; bad=1; continue; fi
  got=$(sha256sum "$f" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then echo "recv: $p sha256 mismatch ($got != $want)" >&2; bad=1; continue; fi
  cp "$f" $R/chunks/ && echo "recv: part $p ok ($(stat -c %s "$f") bytes)"
done
have=$(ls $R/chunks 2>/dev/null | grep -c '^bundle.part-'); need=$(grep -c 'bundle.part-' "$KIT_SRC/MANIFEST")
echo "recv: $have of $need parts in $R/chunks ($((SECONDS-t0)) s); uptime: $(cut -d' ' -f1 /proc/uptime) s"
exit $bad
