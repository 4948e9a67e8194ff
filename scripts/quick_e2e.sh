#!/usr/bin/env bash
# The whole path on this machine, quickly: benchmark -> plan -> measured runs -> validate -> report.
#
#   scripts/quick_e2e.sh [OUT_DIR]        (default out/quick; `make quick` runs it)
#
# Every step is a specmoe command (or scripts/measure_runs.py for the runs) in --quick mode on the
# bundled model, so the whole path finishes in minutes on a CPU. Each step writes into its own
# folder under OUT_DIR; the report at the end reads them all. Environment: PYTHON (default
# .venv/bin/python), SPECMOE_QUICK_RUNS (a folder of runs already measured, to skip the run
# step). The quick runs also time a 1-layer dummy OLMoE; its runs are reported, and validate
# scores the bundled model's (the plan's model).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-out/quick}
py=${PYTHON:-$here/.venv/bin/python}
[ -x "$py" ] || py=python3
model=$("$py" -c "from specmoe.data import corpus; print(corpus.bundled_model_dir())")
specmoe() { "$py" -m specmoe.cli "$@"; }
say() { echo "quick_e2e: $*" >&2; }
start=$(date +%s)

mkdir -p "$out"

trace=$("$py" -c "from specmoe.data import corpus; print(corpus.bundled_trace_path('fit'))")
if [ ! -f "$trace" ]; then
    say "0/5 no bundled fit trace: capturing 4000 tokens of the bundled model's routing"
    trace=$out/trace/fit.npz
    [ -f "$trace" ] || specmoe capture --model bundled --tokens 4000 --out "$trace" --quiet >/dev/null
fi

say "routing statistics of the trace"
specmoe stats "$trace" --model "$model" --out "$out/stats" >/dev/null

say "1/5 benchmark of the expert operation (the bundled model, quick)"
specmoe bench --model "$model" --trace "$trace" --quick --out "$out/bench" >/dev/null

say "2/5 plan from the recorded routing and the measured bandwidths"
specmoe plan --model "$model" --trace "$trace" --bandwidth "$out/bench/profile.json" \
    --out "$out/plan" >/dev/null

if [ -n "${SPECMOE_QUICK_RUNS:-}" ]; then
    say "3/5 measured runs from $SPECMOE_QUICK_RUNS"
    runs=$SPECMOE_QUICK_RUNS
else
    say "3/5 measured runs (verify times with dedup off/on, oracle-draft throughput; quick)"
    "$py" "$here/scripts/measure_runs.py" --quick --out "$out/runs"
    runs=$out/runs
fi

say "4/5 validation against the pre-registered rules"
specmoe validate --plan "$out/plan/plan.json" --runs "$runs" \
    --profile "$out/bench/profile.json" --out "$out/validation"   # exit 0 whatever the verdict

say "5/5 report"
specmoe report "$out" --out "$out/report.html"
say "done in $(( $(date +%s) - start )) s: $out/report.html"
