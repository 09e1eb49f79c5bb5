#!/bin/bash
# bash .gpu/kit/poll.sh [--wait SECONDS] [--files STEP] [STEP...]
# Prints where the chain is (each step: running/exit status, seconds, verdict; the running step's last lines)
# and copies into $OUT (at most 8 files come back): STEP.tgz for every finished step (or the STEPs named:
# the whole results directory: result.json, report.html, terminal.txt, requests.jsonl, logs/, bench/...),
# misc.tgz (chain.log, vllm-argv.log, gpuguard.log, install.log, nvidia-smi) and status.txt.
# --wait S: first wait until the chain ends or S seconds pass (a progress line a minute).
# --files STEP: STEP's result.json, report.html, terminal.txt as plain files, the rest as STEP.tgz.
source "$(dirname "$0")/env.sh"
O=${OUT:-$R/OUT}; mkdir -p $O
WAIT=0; FILES=""; NAMES=()
while [ $# -gt 0 ]; do
  case $1 in --wait) WAIT=$2; shift 2;; --files) FILES=$2; shift 2;; *) NAMES+=("$1"); shift;; esac
done
running() { [ -f $R/out/chain.pid ] && kill -0 "$(cat $R/out/chain.pid)" 2>/dev/null; }
steps() { ls -d $R/out/*/ 2>/dev/null | grep -v '\.prev-' | while read d; do [ -f $d/_started ] && echo "$(cat $d/_started) $(basename $d)"; done | sort | awk '{print $2}'; }
current() { for s in $(steps); do [ -f $R/out/$s/_rc ] || echo $s; done | tail -1; }
progress() {
  local s=$(current); [ -n "$s" ] || return
  local d=$R/out/$s; local log=$(ls -t $d/logs/*.log $d/control.log 2>/dev/null | head -1)
  echo "  [$s running $(( $(date +%s) - $(date -d "$(cat $d/_started)" +%s) )) s] $(tail -c 300 $d/terminal.txt 2>/dev/null | tr '\n\r' '  ' | tail -c 160)"
  [ -n "$log" ] && echo "    $(basename $log): $(tail -n 2 $log | cut -c1-200 | tr '\n' ' ')"
}
t0=$SECONDS
if [ "$WAIT" -gt 0 ]; then
  last=0
  while running && [ $((SECONDS-t0)) -lt $WAIT ]; do
    if [ $((SECONDS-last)) -ge 60 ]; then echo "poll $(date -u +%T) [+$((SECONDS-t0))s]"; progress; last=$SECONDS; fi
    sleep 5
  done
fi
{
  echo "poll $(date -u +%FT%TZ): chain $(running && echo RUNNING || echo 'not running'); uptime $(cut -d' ' -f1 /proc/uptime) s"
  for s in $(steps); do
    d=$R/out/$s
    if [ -f $d/_rc ]; then st="rc=$(cat $d/_rc) in $(cat $d/_seconds) s"; else st="running"; fi
    v=$(python3 - $d/result.json <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
print(r.get("phase"), r.get("verdict"), r.get("reason"), "|", (r.get("message") or "")[:300].replace("\n", " "))
for s in r.get("stages", []):
    c, t = s.get("control") or {}, s.get("treatment") or {}
    f = lambda x: "-" if x is None else f"{x:.2f}"
    print(f"    {s['name']}: {s.get('verdict')} speed-up {f((s.get('speedup') or {}).get('estimate'))} "
          f"TPOT p50 c/t {f(c.get('tpotP50'))}/{f(t.get('tpotP50'))} TTFT p50 c/t {f(c.get('ttftP50'))}/{f(t.get('ttftP50'))} "
          f"n c/t {c.get('requests')}/{t.get('requests')} accept {f((s.get('acceptance') or {}).get('rate'))} match {s.get('outputMatch')}")
rec = r.get("recommendation") or {}
if rec: print("    recommendation:", rec.get("note"))
print("    release:", (r.get("environment") or {}).get("vllmVersion"))
PY
)
    [ -f $d/compare.txt ] && v="$(cat $d/compare.txt)"
    echo "$s: $st"; [ -n "$v" ] && echo "  $v"
  done
  grep -h . $R/out/gpuguard.log 2>/dev/null | tail -5 | sed 's/^/  gpuguard: /'
} > $O/status.txt
cat $O/status.txt; progress
# what comes back
keep=6; [ -n "$FILES" ] && keep=3
[ ${#NAMES[@]} -gt 0 ] || NAMES=($(for s in $(steps); do [ -f $R/out/$s/_rc ] && echo $s; done | tail -$keep))
for s in "${NAMES[@]}"; do
  [ -d $R/out/$s ] || continue
  tar czf $O/$s.tgz -C $R/out $s 2>/dev/null
  if [ $(stat -c %s $O/$s.tgz) -gt 16000000 ]; then
    tar czf $O/$s.tgz -C $R/out --exclude='requests.jsonl' --exclude='*.jsonl' $s; echo "($s.tgz without *.jsonl: too big)"
  fi
done
if [ -n "$FILES" ] && [ -d $R/out/$FILES ]; then
  for f in result.json report.html terminal.txt; do [ -f $R/out/$FILES/$f ] && cp $R/out/$FILES/$f $O/$FILES-$f; done
fi
nvidia-smi > $R/out/nvidia-smi-now.txt 2>&1
(cd $R/out && tar czf $O/misc.tgz $(ls chain.log vllm-argv.log gpuguard.log install.log nvidia-smi-now.txt 2>/dev/null))
ls -la $O | tail -n +2 | awk '{print "  out:", $5, $9}'
