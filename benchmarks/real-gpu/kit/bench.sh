#!/bin/bash
# bash $R/kit/bench.sh   (a step of chain.sh; synchronous, ~3-4 min: one arm start + 3 x ~35 s of load)
# Starts the control arm of exp/bench.yaml (= (a)'s control command line, rendered by the project), then on
# that one server process: the project's load generator (proj1: warm-up + c1 + c4), `vllm bench serve` on the
# same prompts (export_prompts.py: --dataset-name custom, same max_tokens/ignore_eos/temperature/top_p, closed
# loop = --max-concurrency C --request-rate inf), the project's load generator again (proj2, drift check),
# stops the arm and writes compare.txt/compare.json (compare.py; + (a)'s result.json control figures).
# Results: $R/out/bench/. BENCH_PASS2=0 skips proj2.
set -uo pipefail
source "$(dirname "$0")/env.sh"
K=$R/kit; EXP=${BENCH_EXP:-$K/exp/bench.yaml}; D=$R/out/bench; PORT=${BENCH_PORT:-8123}; URL=http://127.0.0.1:$PORT
mkdir -p $D; t0=$SECONDS
say() { echo "bench $(date -u +%T) [+$((SECONDS-t0))s] $*"; }
stop_arm() {
  [ -n "${SPID:-}" ] || return 0
  kill -TERM -- -$SPID 2>/dev/null
  for i in $(seq 1 30); do kill -0 -- -$SPID 2>/dev/null || break; sleep 1; done
  kill -KILL -- -$SPID 2>/dev/null; SPID=""
  bash $K/gpuguard.sh "after bench control arm"
}
trap stop_arm EXIT
argv=$(python3 $K/preflight.py --argv control $EXP $PORT) || { say "cannot render the control argv"; exit 1; }
mapfile -t ARGV < <(python3 -c 'import json,sys; print("\n".join(json.loads(sys.argv[1])))' "$argv")
echo "${ARGV[*]}" > $D/control.argv; say "control: ${ARGV[*]}"
setsid "${ARGV[@]}" > $D/control.log 2>&1 < /dev/null &
SPID=$!
python3 - "$URL" "$SPID" <<'PY' || { say "control arm not healthy"; tail -20 $D/control.log; exit 1; }
import sys, time, urllib.request, os
url, pid = sys.argv[1], int(sys.argv[2]); end = time.time() + 600
while time.time() < end:
    try:
        if urllib.request.urlopen(url + "/health", timeout=2).status == 200: sys.exit(0)
    except Exception: pass
    try: os.kill(pid, 0)
    except OSError: print("control arm exited"); sys.exit(1)
    time.sleep(0.5)
sys.exit(1)
PY
say "control healthy"
python3 $K/projload.py $EXP $URL $D/proj1 2>&1 | grep -v '^\s*$' | tail -4; say "proj1 done"
python3 $K/export_prompts.py $EXP $D/prompts || exit 1
for f in $D/prompts/*.args.json; do
  st=$(basename $f .args.json)
  mapfile -t BA < <(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["bench_args"]))' $f)
  echo "vllm bench serve --base-url $URL ${BA[*]} ..." > $D/bench-$st.cmd
  vllm bench serve --base-url $URL "${BA[@]}" --num-warmups 2 --percentile-metrics ttft,tpot,itl,e2el \
     --metric-percentiles 50,90,99 --save-result --save-detailed --result-dir $D/bench --result-filename $st.json \
     --disable-tqdm > $D/bench-$st.log 2>&1
  say "vllm bench $st rc=$?: $(grep -E 'Median (TTFT|TPOT)' $D/bench-$st.log | tr -s ' ' | tr '\n' ' ')"
done
[ "${BENCH_PASS2:-1}" = 1 ] && { python3 $K/projload.py $EXP $URL $D/proj2 --no-warmup 2>&1 | grep -v '^\s*$' | tail -3; say "proj2 done"; }
stop_arm
python3 $K/compare.py $D $R/out/a/result.json
say "done"
