#!/bin/bash
# bash .gpu/kit/proj.sh -- (re)installs the project into $R/proj and refreshes $R/kit from the carried kit:
# kit/whl/specdecode_operator-*.whl when mkwheel.sh built one, else a copy of the carried operator/specdecode.
# Safe between experiments (a running one keeps the modules it imported); use it after a code fix.
set -uo pipefail
source "$(dirname "$0")/env.sh"
REPO=$(cd "$KIT_SRC/../.." && pwd)
if [ "$KIT_SRC" != "$R/kit" ]; then rm -rf $R/kit.new && cp -r $KIT_SRC $R/kit.new && rm -rf $R/kit && mv $R/kit.new $R/kit; fi
rm -rf $R/proj.new; mkdir -p $R/proj.new
w=$(ls $R/kit/whl/specdecode_operator-*.whl 2>/dev/null | tail -1)
if [ -n "${KIT_PROJ_SRC:-}" ]; then   # rehearsal: another tree's operator/ (e.g. a worktree with a fix)
  cp -r $KIT_PROJ_SRC/specdecode $R/proj.new/ || exit 1; echo "project: copy of $KIT_PROJ_SRC/specdecode"
elif [ -n "$w" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target $R/proj.new "$w" || exit 1
  echo "project: $(basename $w)"
else
  cp -r $REPO/operator/specdecode $R/proj.new/ || exit 1
  echo "project: copy of $REPO/operator/specdecode ($(cd $REPO && git rev-parse --short HEAD 2>/dev/null || echo '?'), no wheel)"
fi
rm -rf $R/proj; mv $R/proj.new $R/proj
