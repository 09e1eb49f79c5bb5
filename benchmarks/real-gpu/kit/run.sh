#!/bin/bash
# bash .gpu/kit/run.sh STEP...   e.g. `run.sh a bench c b` (the default) or `run.sh a20`
# Starts chain.sh STEP... under setsid nohup (it outlives the call; the machine must stay warm: the next call
# within 30 s). Refuses while a chain runs. Output: $R/out/chain.log and $R/out/STEP/. Read it with poll.sh.
source "$(dirname "$0")/env.sh"
[ -f $R/kit/chain.sh ] || { echo "run.sh: $R/kit missing: run install.sh first" >&2; exit 1; }
if [ -f $R/out/chain.pid ] && kill -0 "$(cat $R/out/chain.pid)" 2>/dev/null; then
  echo "run.sh: a chain is running (pid $(cat $R/out/chain.pid)); poll.sh, or stop.sh first" >&2; exit 1
fi
[ $# -gt 0 ] || set -- a bench c b
rm -f $R/out/STOP
cd $R/out && setsid nohup bash $R/kit/chain.sh "$@" >> $R/out/chain.log 2>&1 < /dev/null &
sleep 1; echo "run.sh: chain started (pid $(cat $R/out/chain.pid 2>/dev/null)): $*"
