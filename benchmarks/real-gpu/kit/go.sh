#!/bin/bash
# bash .gpu/kit/go.sh PART [STEP...]   -- the call that carries the LAST part: recv.sh PART, install.sh,
# run.sh STEP... (default: a bench c b), then poll.sh --wait until ~560 s into the call.
set -uo pipefail
source "$(dirname "$0")/env.sh"
part=$1; shift
bash $KIT_SRC/recv.sh $part || exit 1
bash $KIT_SRC/install.sh 2>&1 | tee $R/out/install.log
[ ${PIPESTATUS[0]} = 0 ] || { echo "go.sh: install failed; fix, then: bash .gpu/kit/install.sh (parts stay in $R/chunks while warm)"; exit 1; }
bash $R/kit/run.sh "$@"
left=$(( ${GO_BUDGET_S:-560} - SECONDS )); [ $left -gt 30 ] || left=30
bash $R/kit/poll.sh --wait $left
