#!/usr/bin/env bash
# The whole-pass predictions for llama.cpp (results/cpu/llamacpp/whole-pass/README.md), from
# per-node profiles of llama.cpp's own graph alone: for each configuration the benchmark
# (`specmoe bench --engine llama.cpp --whole-pass`: every operation of the verify pass and
# the expert fit of its MUL_MAT_ID, one process, 4 depths, n = 1..9) and the plan with the
# bundled validation trace as the routing of the expert operation, written to
# results/cpu/llamacpp/whole-pass/predictions/<config>/{profile.json,plan.json}.
# Committed before any campaign unit runs.
#
# Usage: bash scripts/llamacpp_predictions.sh [llamacpp-bundled|llamacpp-lifted]...
#
# REFIT=step1 (or linear): a further version, nothing measured: the committed profile's
# medians refitted in that form (`specmoe bench --from ... --fit`), then the plan, written to
# results/cpu/llamacpp/whole-pass/predictions-<form>/<config>/ (docs/runs-protocol-llamacpp.md,
# round 2).
#
# GRAPH_REUSE=1 (round 6): the benchmark times each pass after an untimed one of its own size.
# PASS_TRAIN=M (round 9): each pass the median of M in a row of its size on moving windows,
# before the profiled passes (`specmoe bench --pass-train M`).
#
# DEPTHS=D1,D2,... (round 12): the benchmark's depths instead of 256,512,1024,2048.
#
# KV_TYPE=q8_0 (round 14): the benchmark's KV cache keys in q8_0 (`specmoe bench --kv-type`);
# the campaign then runs its units with the same cache (its profile's whole_pass.kv_type).
#
# OUT=DIR (round 3, measured on another machine): the predictions written to DIR/<config>/
# instead, with FIT=FORM the fresh benchmark's fit form (default step1), and REFIT read from
# FROM=DIR (default: results/cpu/llamacpp/whole-pass/predictions). Each benchmark also writes
# the processor's identity, DIR/<config>/machine.json: the campaign runs its units only there.
set -euo pipefail
cd "$(dirname "$0")/.."
SPECMOE=${SPECMOE:-.venv/bin/specmoe}
PY=${PY:-.venv/bin/python}
P0=${FROM:-results/cpu/llamacpp/whole-pass/predictions}
REFIT=${REFIT:-}
OUT=${OUT:-}
FIT=${FIT:-step1}
GRAPH_REUSE=${GRAPH_REUSE:-}  # 1: the benchmark's passes after a pass of their own size (round 6)
PASS_TRAIN=${PASS_TRAIN:-}  # M: the benchmark's passes the medians of trains of M (round 9)
KV_TYPE=${KV_TYPE:-}  # q8_0: the KV cache's keys in q8_0 (round 14; default llama.cpp's f16)
P=${OUT:-results/cpu/llamacpp/whole-pass/predictions${REFIT:+-$REFIT}}
CACHE=${SPECMOE_CACHE:-$HOME/.cache/specmoe}
VAL=specmoe/data/traces/validation.npz
DEPTHS=${DEPTHS:-256,512,1024,2048}  # the benchmark's depths (round 12: one past the runs' deepest KV view)

predict() {  # name, GGUF, reps, plan --model
  local name=$1 gguf=$2 reps=$3 spec=$4
  local out=$P/$name
  mkdir -p "$out/bench" "$out/plan"
  echo "== $name: per-node profile of every operation" >&2
  local t0=$SECONDS
  if [ -n "$REFIT" ]; then
    $SPECMOE bench --engine llama.cpp --whole-pass --model "$gguf" --from "$P0/$name/profile.json" \
      --fit "$REFIT" --out "$out/bench"
  else
    nice -n 10 $SPECMOE bench --engine llama.cpp --whole-pass --model "$gguf" --depths "$DEPTHS" \
      --reps "$reps" --fit "$FIT" ${GRAPH_REUSE:+--graph-reuse} \
      ${PASS_TRAIN:+--pass-train "$PASS_TRAIN"} ${KV_TYPE:+--kv-type "$KV_TYPE"} --out "$out/bench"
  fi
  if [ -n "$OUT" ]; then  # the processor beyond its name, checked before each campaign unit
    if [ -n "$REFIT" ] && [ -f "$P0/$name/machine.json" ]; then
      cp "$P0/$name/machine.json" "$out/machine.json"
    else
      $PY -c 'import json; from specmoe.bench.machine import cpu_identity
print(json.dumps(cpu_identity(), indent=1))' > "$out/machine.json.part"
      mv "$out/machine.json.part" "$out/machine.json"
    fi
  fi
  echo "== $name: benchmark wall $((SECONDS - t0)) s" >&2
  cp "$out/bench/profile.json" "$out/profile.json"
  echo "== $name: plan" >&2
  $SPECMOE plan --model "$spec" --trace "$VAL" --bandwidth "$out/profile.json" --context 512 \
    --out "$out/plan"
  cp "$out/plan/plan.json" "$out/plan.json"
  # the cache's paths under the home directory written as ~ (as the other results do)
  grep -rl "$HOME/" "$out" | xargs -r sed -i "s#$HOME/#~/#g"
}

for name in ${@:-llamacpp-bundled llamacpp-lifted}; do
  case $name in
    llamacpp-bundled)
      predict llamacpp-bundled "$CACHE/gguf/bundled-f32.gguf" 21 specmoe/data/tiny_olmoe ;;
    llamacpp-lifted)
      predict llamacpp-lifted "$CACHE/lifted/OLMoE-1B-7B-0125-4L-bf16.gguf" 7 \
        "$CACHE/lifted/OLMoE-1B-7B-0125-4L-bf16" ;;
    *) echo "llamacpp_predictions: unknown configuration $name" >&2; exit 2 ;;
  esac
done
