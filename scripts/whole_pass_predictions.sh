#!/usr/bin/env bash
# The whole-pass predictions of docs/runs-protocol-whole-pass.md, from benchmarks alone:
# for each configuration the expert benchmark, the per-operation benchmark of every other
# operation of a verify pass (--whole-pass) and the plan, written to
# results/cpu/whole-pass/predictions/<config>/{profile.json,plan.json} (and the benchmark's
# own folder bench/). Committed before any unit of the campaign runs
# (scripts/whole_pass_campaign.py records their SHA-256 and refuses changed ones).
#
# Usage: bash scripts/whole_pass_predictions.sh [bundled|olmoe-dummy-4L|qwen3-dummy-4L]...
# Environment: PREDICTIONS (the folder written, default results/cpu/whole-pass/predictions),
# PROCESSES (the whole-pass benchmark's processes; default 5, 1 for bundled as its first
# prediction ran), FIT (the whole pass's fit form, specmoe bench --fit: plain, switch, pern).
set -euo pipefail
cd "$(dirname "$0")/.."
SPECMOE=${SPECMOE:-.venv/bin/specmoe}
PY=${PY:-.venv/bin/python}
P=${PREDICTIONS:-results/cpu/whole-pass/predictions}
FIT=${FIT:-plain}
export SPECMOE_NUM_THREADS=1 OMP_NUM_THREADS=1
VAL=specmoe/data/traces/validation.npz

predict() {  # name, expert-bench args, whole-pass model, plan args, trace
  local name=$1 bench_args=$2 wp_model=$3 plan_args=$4 trace=$5
  local out=$P/$name
  mkdir -p "$out"
  echo "== $name: expert benchmark" >&2
  # shellcheck disable=SC2086
  $SPECMOE bench $bench_args --trace "$trace" --clock cpu --threads 1 --out "$out/bench"
  # the kernels' source this benchmark compiled, committed with it: the campaign builds these
  # for the configuration's runs (amendment 8), whatever the package's kernels become
  $PY -c \
    'import sys; from specmoe.kernels._cbuild import source; sys.stdout.write(source())' \
    > "$out/kernels.c.part"
  mv "$out/kernels.c.part" "$out/kernels.c"
  # and the processor beyond its name (amendment 9), checked before each of its units
  $PY -c 'import json; from specmoe.bench.machine import cpu_identity
print(json.dumps(cpu_identity(), indent=1))' > "$out/machine.json.part"
  mv "$out/machine.json.part" "$out/machine.json"
  echo "== $name: every other operation of the pass" >&2
  # shellcheck disable=SC2086
  # amendment 7: five processes, the median one kept (bundled's committed prediction used one)
  local processes=5
  [ "$name" = bundled ] && processes=1
  processes=${PROCESSES:-$processes}
  $SPECMOE bench --model $wp_model --whole-pass --depths 512,2048 --reps 21 \
    --processes "$processes" --fit "$FIT" --from "$out/bench/profile.json" --out "$out/bench"
  cp "$out/bench/profile.json" "$out/profile.json"
  echo "== $name: plan" >&2
  # shellcheck disable=SC2086
  $SPECMOE plan $plan_args --trace "$trace" --bandwidth "$out/profile.json" --context 512 \
    --out "$out/plan"
  cp "$out/plan/plan.json" "$out/plan.json"
}

for name in "${@:-bundled olmoe-dummy-4L}"; do
  for n in $name; do
    case $n in
      bundled)
        predict bundled "--model specmoe/data/tiny_olmoe" bundled \
          "--model specmoe/data/tiny_olmoe" "$VAL" ;;
      olmoe-dummy-4L)
        predict olmoe-dummy-4L "--model OLMoE-1B-7B-0125 --dtype bfloat16" \
          "OLMoE-1B-7B-0125-dummy --layers 4" "--model OLMoE-1B-7B-0125 --layers 4" "$VAL" ;;
      qwen3-dummy-4L)
        R=$P/qwen3-dummy-4L/routing.npz
        mkdir -p "$P/qwen3-dummy-4L"
        [ -f "$R" ] || $SPECMOE synth --from "$VAL" --model Qwen3-30B-A3B --layers 4 \
          --variant uniform --seed 0 --tokens 32768 --doc-tokens 1024 --out "$R"
        predict qwen3-dummy-4L "--model Qwen3-30B-A3B --dtype bfloat16" \
          "Qwen3-30B-A3B-dummy --layers 4" "--model Qwen3-30B-A3B --layers 4" "$R" ;;
      *) echo "whole_pass_predictions: unknown configuration $n" >&2; exit 2 ;;
    esac
  done
done
