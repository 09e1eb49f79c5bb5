#!/bin/bash
# bash $R/kit/chain.sh STEP...   (run.sh starts it detached; one step after the other)
# STEP: a | b | c (exp/*-synth.yaml, c-tiny-lossless.yaml: spec.engine.vllmVersion unset, the release comes
# from `vllm --version`), a20 | b20 | c20 (the same with vllmVersion "0.20.0"), bench (bench.sh), or a path
# to an experiment YAML (step name = file name). Each experiment: `specdecode run FILE --local --out
# $R/out/STEP --quiet`, stdout+stderr in $R/out/STEP/terminal.txt, exit status in _rc, at most
# EXP_TIMEOUT s (900; then SIGINT: the project keeps what it measured). Before the next step
# nothing may hold the GPU (gpuguard.sh). `touch $R/out/STOP` ends the chain before its next step.
# CHAIN_BUDGET_S (seconds from the chain's start; unset: no limit): a step whose estimate (EST_<step>, s, below)
# would end past it is skipped, and so is every later step, so that the last poll comes back in time.
set -u
source "$(dirname "$0")/env.sh"
K=$R/kit
echo $$ > $R/out/chain.pid
trap 'rm -f $R/out/chain.pid' EXIT
yaml_of() {
  case $1 in
    a) echo $K/exp/a-tiny-synth.yaml;; a20) echo $K/exp/a-tiny-synth-v020.yaml;;
    b) echo $K/exp/b-1b-synth.yaml;;   b20) echo $K/exp/b-1b-synth-v020.yaml;;
    c) echo $K/exp/c-tiny-lossless.yaml;; c20) echo $K/exp/c-tiny-lossless-v020.yaml;;
    *.yaml) echo $1;;
    *) return 1;;
  esac
}
est() { case $1 in a|a20) echo ${EST_a:-380};; b|b20) echo ${EST_b:-370};; c|c20) echo ${EST_c:-360};; bench) echo ${EST_bench:-240};; *) echo 400;; esac; }
for step in "$@"; do
  if [ -n "${CHAIN_BUDGET_S:-}" ] && [ $((SECONDS + $(est $step))) -gt $CHAIN_BUDGET_S ]; then
    echo "$(date -u +%T) chain: budget: $step (~$(est $step) s) would end past ${CHAIN_BUDGET_S} s (now $SECONDS s): skipping it and the rest"; break
  fi
  [ -f $R/out/STOP ] && { echo "$(date -u +%T) chain: STOP file, skipping $step and after"; break; }
  name=$step; case $step in *.yaml) name=$(basename $step .yaml);; esac
  d=$R/out/$name
  [ -d $d ] && mv $d $d.prev-$(date +%H%M%S)
  mkdir -p $d; date -u +%FT%TZ > $d/_started; echo "$(date -u +%T) chain: $name starts"
  t0=$SECONDS
  if [ $step = bench ]; then
    bash $K/bench.sh > $d/terminal.txt 2>&1; rc=$?
  elif y=$(yaml_of $step); then
    cp $y $d/_experiment-source.yaml
    timeout -s INT -k 60 ${EXP_TIMEOUT:-900} specdecode run $y --local --out $d --quiet > $d/terminal.txt 2>&1; rc=$?
  else
    echo "unknown step $step" > $d/terminal.txt; rc=2
  fi
  echo $rc > $d/_rc; echo $((SECONDS-t0)) > $d/_seconds
  nvidia-smi > $d/nvidia-smi-after.txt 2>&1
  echo "$(date -u +%T) chain: $name rc=$rc in $((SECONDS-t0)) s"
  bash $K/gpuguard.sh "after step $name"
done
echo "$(date -u +%T) chain: end"
