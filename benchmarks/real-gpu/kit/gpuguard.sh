#!/bin/bash
# Before an arm starts (called by the vllm wrapper on `vllm serve`, and by chain.sh between experiments):
# on this one-GPU machine nothing else may hold the GPU. On 2026-12-01 an EngineCore that outlived its API
# server held 122 GiB and the next arm could not start. Waits up to GUARD_WAIT_S (60) for the memory to be
# freed; then SIGTERM/SIGKILL, by PID, the vLLM processes (all started by this kit) still alive.
# Everything it sees or does goes to $R/out/gpuguard.log. GPU_GUARD=0 disables it (to test the project's fix).
R=${KIT_ROOT:-/tmp}; log=$R/out/gpuguard.log; mkdir -p $R/out
[ "${GPU_GUARD:-1}" = 1 ] || exit 0
command -v nvidia-smi >/dev/null || exit 0
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' '; }
limit=${GUARD_MIB:-3000}; why=${1:-before vllm serve}
u=$(used); [ -n "$u" ] && [ "$u" -le "$limit" ] && exit 0
echo "$(date -u +%T) gpuguard ($why): $u MiB in use; compute apps: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';')" >> $log
for i in $(seq 1 $(( ${GUARD_WAIT_S:-60} / 2 ))); do
  sleep 2; u=$(used); [ "$u" -le "$limit" ] && { echo "$(date -u +%T)   freed after $((i*2)) s" >> $log; exit 0; }
done
self=$$; anc=" $self $PPID "; p=$PPID
while [ "$p" -gt 1 ] 2>/dev/null; do p=$(ps -o ppid= -p $p | tr -d ' '); anc="$anc$p "; done
victims=""
for pid in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' | grep -E '^[0-9]+$') \
           $(ps -eo pid=,args= | awk '/EngineCore|vllm.entrypoints.cli.main serve|VLLM::/ && !/awk/ {print $1}'); do
  case "$anc" in *" $pid "*) continue;; esac
  case " $victims " in *" $pid "*) ;; *) victims="$victims $pid";; esac
done
for pid in $victims; do echo "$(date -u +%T)   TERM $pid: $(ps -o args= -p $pid 2>/dev/null | cut -c1-160)" >> $log; kill -TERM $pid 2>/dev/null; done
sleep 8
for pid in $victims; do kill -0 $pid 2>/dev/null && { echo "$(date -u +%T)   KILL $pid" >> $log; kill -KILL $pid 2>/dev/null; }; done
sleep 3; echo "$(date -u +%T)   after: $(used) MiB in use" >> $log
exit 0
