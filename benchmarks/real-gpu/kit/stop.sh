#!/bin/bash
# bash .gpu/kit/stop.sh [--now] -- ends the chain after the current step (STOP file); with --now also
# interrupts the running experiment: SIGINT to the chain's own `timeout` child, which passes it to its
# `specdecode run` (the arms are stopped, what was measured is written). Only the chain's children, by PID.
source "$(dirname "$0")/env.sh"
touch $R/out/STOP; echo "stop.sh: no further steps"
if [ "${1:-}" = --now ] && [ -f $R/out/chain.pid ]; then
  for pid in $(ps -o pid= --ppid "$(cat $R/out/chain.pid)"); do
    case "$(ps -o args= -p $pid)" in timeout*|bash*bench.sh*) echo "stop.sh: SIGINT $pid"; kill -INT $pid;; esac
  done
fi
