#!/usr/bin/env bash
# The GPU part of specmoe in one run (about 5 minutes on one H200; every step has a timeout and
# the run a budget of BUDGET_S = 450 s, so the whole stays under 8 minutes):
#   1. facts: GPU, driver, torch, CUDA, Triton, transformers;
#   2. the kernel contract on CUDA: tests/test_kernels.py (CUDA classes) with pytest, or the
#      standalone self-check (scripts/kernel_selfcheck.py) where pytest is missing;
#   3. the expert-operation benchmark at OLMoE-1B-7B-0125 and Qwen3-30B-A3B shapes in bf16,
#      every kernel including transformers' peers (a kernel that fails is left out and said;
#      if the whole run fails, ours alone are timed again);
#   4. target efficiency against batch size; 5. the whole-pass prediction against measured
#      verify passes (scripts/gpu_whole_pass.py); 6. opt-in (TRANSFER_S > 0 seconds): the
#      bandwidth transfer to a held-out model (scripts/transfer_profiles.py, specmoe transfer).
#
# Usage (from anywhere): bash scripts/gpu_check.sh [RESULTS_DIR]   (default results/h200)
# Environment: PYTHON (default python3). Needs torch with CUDA; Triton, transformers, pytest,
# rich and matplotlib are used when present. No network access is needed: the package runs
# from the source tree through PYTHONPATH.
#
# Writes RESULTS_DIR/: log.txt (everything, with set -x), status.txt (one line per step: its
# exit status and seconds), env.txt, contract_junit.xml or contract_selfcheck.json, traces/,
# and per model a folder with profile.json, timings.json, the figures and summary.json.
# Routing: OLMoE uses the bundled fit trace when it is installed; otherwise, and for Qwen3
# (N = 128), a synthetic trace in which each expert of a token is kept by the next token with
# probability ρ(2) of paper 002 Section 2 (0.363 OLMoE, 0.480 Qwen3), so its windows have the
# reuse of recorded routing at n = 2 (the windows are labelled synthetic in the profile).

set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
RES="${1:-results/h200}"
mkdir -p "$RES/traces"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1

BUDGET_S="${BUDGET_S:-450}"  # the whole run, steps' timeouts included, fits in this
DEADLINE=$(( $(date +%s) + BUDGET_S ))

step() {  # step NAME TIMEOUT_S COMMAND... : run within the time left, log, never abort
    local name=$1 limit=$2 t0 rc left
    shift 2
    t0=$(date +%s)
    left=$(( DEADLINE - t0 ))
    if [ "$left" -lt 20 ]; then
        echo "$name skipped: ${left}s left of the budget" >> "$RES/status.txt"
        return 124
    fi
    if [ "$limit" -gt "$left" ]; then limit=$left; fi
    timeout --kill-after=5 "$limit" "$@"
    rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s (limit ${limit}s)" >> "$RES/status.txt"
    return $rc
}

have() { "$PY" -c "import $1" > /dev/null 2>&1; }

main() {
    set -x
    date -u
    : > "$RES/status.txt"

    # 1. facts ---------------------------------------------------------------------------
    nvidia-smi || true
    step env 60 "$PY" - <<'EOF' > "$RES/env.txt"
import importlib, platform, sys
print("python", sys.version.split()[0], platform.platform())
for mod in ("torch", "triton", "transformers", "numpy", "scipy", "pytest", "rich", "matplotlib"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as exc:
        print(mod, "missing", type(exc).__name__)
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
          "memory_GiB", round(p.total_memory / 2**30, 1), "L2_MiB", getattr(p, "L2_cache_size", 0) / 2**20)
EOF
    cat "$RES/env.txt"

    # 2. the kernel contract on CUDA -------------------------------------------------------
    if have pytest; then
        step contract_pytest 200 "$PY" -m pytest -p no:xdist -p no:cacheprovider -q -rs \
            -m cuda tests/test_kernels.py --junitxml="$RES/contract_junit.xml"
    else
        step contract_selfcheck 150 "$PY" scripts/kernel_selfcheck.py --device cuda --json \
            > "$RES/contract_selfcheck.json"
    fi

    # 3. routing for the recorded windows --------------------------------------------------
    step traces 60 "$PY" - "$RES/traces" <<'EOF'
import sys
from pathlib import Path
from specmoe.formats.trace import save_trace

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)

def sticky(num_experts, m, layers, rho, tokens=1200, docs=12, seed=0):
    from specmoe.routing.synth import sticky_trace

    return sticky_trace(num_experts, m, layers, rho, tokens=tokens, docs=docs, seed=seed,
                        source=f"synthetic: each expert kept by the next token with probability {rho}")


save_trace(sticky(64, 8, 16, 0.363), out / "olmoe_synthetic.npz")
save_trace(sticky(128, 8, 48, 0.480, seed=1), out / "qwen3_synthetic.npz")
try:
    from specmoe.data.corpus import bundled_trace_path
    p = bundled_trace_path("fit")
    print("bundled fit trace:", p, "present" if p.exists() else "missing")
    if p.exists():
        (out / "olmoe_trace.txt").write_text(str(p))
except Exception as exc:
    print("no bundled trace:", exc)
EOF
    local olmoe_trace="$RES/traces/olmoe_synthetic.npz"
    if [ -s "$RES/traces/olmoe_trace.txt" ]; then olmoe_trace="$(cat "$RES/traces/olmoe_trace.txt")"; fi

    # 4. the benchmark, bf16, every kernel -------------------------------------------------
    bench() {  # bench LABEL MODEL TRACE
        local label=$1 model=$2 trace=$3
        mkdir -p "$RES/$label"
        if ! step "bench_$label" 150 "$PY" -m specmoe.cli bench --model "$model" \
                --trace "$trace" --device cuda --dtype bfloat16 --kernels all \
                --layers 6 --windows 4 --reps 5 --json --out "$RES/$label" \
                > "$RES/$label/summary.json"; then
            step "bench_${label}_ours" 100 "$PY" -m specmoe.cli bench --model "$model" \
                --trace "$trace" --device cuda --dtype bfloat16 --kernels per_slot,dedup \
                --layers 4 --windows 4 --reps 3 --json --out "$RES/${label}_ours" \
                > "$RES/${label}_ours/summary.json" || true
        fi
    }
    mkdir -p "$RES/olmoe_ours" "$RES/qwen3_ours"
    bench olmoe OLMoE-1B-7B-0125 "$olmoe_trace"
    bench qwen3 Qwen3-30B-A3B "$RES/traces/qwen3_synthetic.npz"
    rmdir "$RES/olmoe_ours" "$RES/qwen3_ours" 2> /dev/null

    # 5. a short digest ----------------------------------------------------------------------
    "$PY" - "$RES" <<'EOF' || true
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("*/summary.json")):
    try:
        d = json.loads(f.read_text())
    except Exception as exc:
        print(f, "unreadable:", exc)
        continue
    print(f"{f.parent.name}: {d['model']} on {d['device_name']} ceiling {d['ceiling_gbps']:.0f} GB/s,"
          f" crossover {d['crossover']}, reread {d['reread_cost']}")
    for k, v in d.get("kernels", {}).items():
        print(f"  {k:>14} beta GB/s " + " ".join(f"{x:.0f}" for x in v["beta_gbps"])
              + "  roofline " + " ".join(f"{x:.2f}" for x in v["roofline_ratio"]))
    for k, v in d.get("implementations", {}).items():  # what each kernel name really ran
        fb = v.get("fallback")
        print(f"  {k:>14} ran {v['ran']}" + (f" (FELL BACK from {v['requested']}: {fb})" if fb else ""))
EOF
    # >>> efficiency: target efficiency and speedup against batch size (paper 003) >>>>>>>>>>>
    # Full-shape OLMoE-1B-7B (16 layers, dummy weights, bf16), B 1..32, K 3/5/7, dedup kernel,
    # routing: uniform, IPF (uniform and skewed) and recorded (the bundled fit trace, else the
    # sticky synthetic trace above). Its own time (EFFICIENCY_S, default 240 s) is added to the
    # budget; a failure or timeout is logged in status.txt and the run goes on.
    DEADLINE=$(( DEADLINE + ${EFFICIENCY_S:-240} ))
    mkdir -p "$RES/efficiency_olmoe"
    step efficiency_olmoe 230 "$PY" -m specmoe.cli efficiency --model OLMoE-1B-7B-0125 \
        --device cuda --routing "uniform,ipf-uniform,ipf-skewed,$olmoe_trace" \
        --stats "$olmoe_trace" --batch 1,2,4,8,16,32 --k 3,5,7 --context 512 \
        --repeats 5 --warmup 2 --kernel dedup --json --out "$RES/efficiency_olmoe" \
        > "$RES/efficiency_olmoe/summary.json" \
        || echo "efficiency_olmoe failed (see log.txt)" >> "$RES/status.txt"
    # <<< efficiency <<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<
    # >>> whole pass: every operation of a verify pass benchmarked on the GPU, the plan, then the
    # engine's measured verify passes n = 1..9 (docs/runs-protocol-whole-pass.md on CUDA).
    # OLMoE-1B-7B shapes, dummy weights, 8 decoder layers (the load is the cost), routing forced
    # from the bundled validation trace. Its own time (WHOLE_PASS_S, default 240 s) is added.
    DEADLINE=$(( DEADLINE + ${WHOLE_PASS_S:-240} ))
    mkdir -p "$RES/whole_pass_olmoe"
    step whole_pass_olmoe 230 "$PY" scripts/gpu_whole_pass.py --model OLMoE-1B-7B-0125 \
        --layers 8 --profile "$RES/olmoe/profile.json" --depth 512 --prompts 4 --repeats 3 \
        --out "$RES/whole_pass_olmoe" > "$RES/whole_pass_olmoe/summary.json" \
        || echo "whole_pass_olmoe failed (see log.txt)" >> "$RES/status.txt"
    # <<< whole pass <<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<
    # >>> transfer: one-layer bf16 profiles of the five presets, each model's bandwidth then
    # predicted from the others (paper 002 App. E, Fig. 7). Opt-in: its own time TRANSFER_S
    # (default 0, so skipped) is added to the budget; a failure is logged and the run goes on.
    DEADLINE=$(( DEADLINE + ${TRANSFER_S:-0} ))
    if [ "${TRANSFER_S:-0}" -gt 0 ]; then
        mkdir -p "$RES/transfer"
        step transfer_profiles "$TRANSFER_S" "$PY" scripts/transfer_profiles.py --device cuda \
            --out "$RES/transfer" --windows 4 --reps 5 \
            || echo "transfer_profiles failed (see log.txt)" >> "$RES/status.txt"
        step transfer 60 "$PY" -m specmoe.cli transfer --profiles "$RES"/transfer/*/ \
            --out "$RES/transfer" || echo "transfer failed (see log.txt)" >> "$RES/status.txt"
    fi
    # <<< transfer <<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<<
    cat "$RES/status.txt"
    date -u
}

main 2>&1 | tee "$RES/log.txt"
