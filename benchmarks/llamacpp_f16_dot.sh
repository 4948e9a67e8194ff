#!/usr/bin/env bash
# Why llama.cpp's one-token pass is dear on an AVX-512 CPU without AVX512-FP16 when the
# model's head dimension is not a multiple of 64, tested by changing the cause.
#
# Without flash attention a one-token pass's K·Q product goes to ggml's vec_dot loop
# (llamafile_sgemm refuses fewer than two columns), which for an f16 KV cache is
# ggml_vec_dot_f16 (ggml/src/ggml-cpu/vec.cpp). On AVX-512 without AVX512-FP16 its SIMD loop
# steps GGML_F16_DOT_STEP = 64 elements (simd-mappings.h); a head of 32 has no full step, so
# every (cell, head) dot product is the scalar remainder loop: 32 conversions through a 256 KiB
# table and 32 dependent double-precision adds.
#
# This builds libggml-cpu three ways from the vendored source (make llama-cpp), with
# benchmarks/patches/ggml-vec-dot-f16-remainder.patch applied and SPECMOE_F16_DOT_REMAINDER
# set to 0 (the remainder loop as shipped: the control, rebuilt here), 1 (F16C conversions in
# place of the table) or 2 (the remainder in 16-lane AVX-512 steps), and times each with
# benchmarks/llamacpp_kv_width.py (LD_LIBRARY_PATH ahead of libllama's RUNPATH), the variants
# alternating round by round. Then llama-bench with the K cache in f16, q8_0 (vec_dot_q8_0_q8_0:
# 32-element blocks, SIMD at any head of 32) and bf16 (AVX512-BF16's loop also steps 64),
# alternating, with the shipped library: the settings a user can change without a rebuild.
#
#     bash benchmarks/llamacpp_f16_dot.sh OUT_DIR [GGUF]
#
# GGUF defaults to ~/.cache/specmoe/gguf/bundled-f32.gguf (specmoe export --format gguf
# --model bundled --outtype f32 --out ...). ROUNDS (3), DEPTHS (511,1023,2047,2303),
# NS (2,1,3,4,5,8,9), REPS (4), CTK_ROUNDS (2), CTK_DEPTHS (512,2048), CTK_REPS (20).
# Writes OUT_DIR/kq-v{0,1,2}-r{1..ROUNDS}.json, OUT_DIR/ctk-{type}-r{1..}.json and
# OUT_DIR/summary.json. About 4 minutes on two cores; run nothing else beside it.
set -euo pipefail

OUT=${1:?usage: bash benchmarks/llamacpp_f16_dot.sh OUT_DIR [GGUF]}
GGUF=${2:-$HOME/.cache/specmoe/gguf/bundled-f32.gguf}
ROUNDS=${ROUNDS:-3}
DEPTHS=${DEPTHS:-511,1023,2047,2303}
NS=${NS:-2,1,3,4,5,8,9}
REPS=${REPS:-4}
CTK_ROUNDS=${CTK_ROUNDS:-2}
CTK_DEPTHS=${CTK_DEPTHS:-512,2048}
CTK_REPS=${CTK_REPS:-20}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}

if [ ! -f "$GGUF" ]; then
    echo "llamacpp_f16_dot: $GGUF: no such GGUF file (specmoe export --format gguf)" >&2
    exit 2
fi
ROOT=$("$PY" -c "from specmoe.engines import llamacpp; print(llamacpp.cache_root())")
if [ ! -f "$ROOT/BUILT" ]; then
    echo "llamacpp_f16_dot: llama.cpp is not built in $ROOT (make llama-cpp)" >&2
    exit 2
fi
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "copying the vendored source and applying the patch" >&2
cp -r "$ROOT/src" "$WORK/src"
patch -s -d "$WORK/src" -p1 <"$HERE/benchmarks/patches/ggml-vec-dot-f16-remainder.patch"
for v in 0 1 2; do
    echo "building libggml-cpu, SPECMOE_F16_DOT_REMAINDER=$v" >&2
    cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -Wno-dev -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_OPENSSL=OFF "-DCMAKE_CXX_FLAGS=-DSPECMOE_F16_DOT_REMAINDER=$v" >"$WORK/cmake-$v.log"
    cmake --build "$WORK/build" -j 2 --target ggml-cpu >"$WORK/build-$v.log"
    mkdir -p "$WORK/v$v"
    cp -a "$WORK/build/bin/"libggml-cpu.so* "$WORK/v$v/"
done

for r in $(seq 1 "$ROUNDS"); do
    for v in 0 1 2; do
        echo "round $r, variant $v" >&2
        LD_LIBRARY_PATH="$WORK/v$v" "$PY" "$HERE/benchmarks/llamacpp_kv_width.py" --gguf "$GGUF" \
            --depths "$DEPTHS" --ns "$NS" --reps "$REPS" --train 12 --drop 4 --profile 4 \
            --out "$OUT/kq-v$v-r$r.json" >/dev/null
    done
done

BENCH="$ROOT/build/bin/llama-bench"
for r in $(seq 1 "$CTK_ROUNDS"); do
    for t in f16 q8_0 bf16; do
        echo "llama-bench -ctk $t, round $r" >&2
        "$BENCH" -m "$GGUF" -p 1,2,3,4,5,6,7,8,9 -n 0 -d "$CTK_DEPTHS" -r "$CTK_REPS" -t 1 \
            -fa off -ctk "$t" -o json >"$OUT/ctk-$t-r$r.json" 2>/dev/null
    done
done

"$PY" - "$OUT" "$ROUNDS" "$CTK_ROUNDS" <<'PYEOF'
import json
import statistics
import sys
from pathlib import Path

out, rounds, ctk_rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
summary = {"variants": {"0": "shipped remainder loop (rebuilt)", "1": "F16C conversions",
                        "2": "16-lane AVX-512 remainder"}, "pass_ms": {}, "kq_ms": {}, "ctk_ms": {}}
for v in "012":
    rows = {}
    for r in range(1, rounds + 1):
        for row in json.loads((out / f"kq-v{v}-r{r}.json").read_text())["rows"]:
            key = f"{row['depth']},{row['n']}"
            rows.setdefault(key, []).append((row["median_ms"], row["nodes_ms"]["kq"]))
    summary["pass_ms"][v] = {k: [round(p, 4) for p, _ in x] for k, x in rows.items()}
    summary["kq_ms"][v] = {k: [round(q, 4) for _, q in x] for k, x in rows.items()}
for t in ("f16", "q8_0", "bf16"):
    rows = {}
    for r in range(1, ctk_rounds + 1):
        for row in json.loads((out / f"ctk-{t}-r{r}.json").read_text()):
            rows.setdefault(f"{row['n_depth']},{row['n_prompt']}", []).append(row["avg_ns"] / 1e6)
    summary["ctk_ms"][t] = {k: [round(x, 4) for x in xs] for k, xs in rows.items()}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
for v in "012":
    one = {k: statistics.median(x) for k, x in summary["pass_ms"][v].items() if k.endswith(",1")}
    print(f"variant {v}: one-token pass ms", {k: round(x, 3) for k, x in one.items()})
for t in ("f16", "q8_0", "bf16"):
    one = {k: statistics.median(x) for k, x in summary["ctk_ms"][t].items() if k.endswith(",1")}
    print(f"-ctk {t}: one-token pass ms", {k: round(x, 3) for k, x in one.items()})
PYEOF
