#!/bin/bash
# gpu_ab_env.sh - one device run for an A/B of an environment switch of the CUDA backend
# (default: DSI_CUDA_PDL=1 vs 0, programmatic dependent launch): build, every CUDA test with the
# switch at A (the default), then `dsinfer bench layer` at context 4096 (decode at AB_BATCH,
# the 8k prefill) alternating A and B twice each, in `fast` and in `plain` numerics at batch 1.
# Logs under $OUT, key lines in $OUT/summary.txt. Usage (repository root, on the GPU machine):
#   OUT=$OUT AB_VAR=DSI_CUDA_PDL AB_A=1 AB_B=0 bash tests/ops/gpu_ab_env.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "== [$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
if [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/include/pcre2.h ]; then
    export CFLAGS="-O2 -g -I$PWD/build/deps/include" LDFLAGS="-L$PWD/build/deps/lib"
    export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
fi
V=${AB_VAR:-DSI_CUDA_PDL} A=${AB_A:-1} B=${AB_B:-0}
BATCH=${AB_BATCH:-1,8,32,128,256}
M=/tmp/flash4
(python3 ref/make_checkpoint.py --preset flash --layers 4 --no-verify --out $M >"$OUT/gen.log" 2>&1
 echo "gen exit $?" >>"$OUT/gen.log") &
GEN=$!
make -j"$(nproc)" BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/dsinfer >"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; log "BUILD FAILED"; exit 1; }
log "build done"
env "$V=$A" timeout 200 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$OUT/test_cuda.log" 2>&1
log "test_cuda $V=$A rc $?: $(tail -1 "$OUT/test_cuda.log")"
grep -oE "\[[^]]*(fast|FAIL)[^]]*\]|FAIL.*" "$OUT/test_cuda.log" | head -20 | tee -a "$OUT/summary.txt"
wait $GEN
log "checkpoint: $(tail -1 "$OUT/gen.log")"
for rep in 1 2; do
    for val in "$A" "$B"; do
        env "$V=$val" timeout 120 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 7 \
            --batch "$BATCH" --no-split --prefill 8192 --prefill-reps 1 --numerics fast \
            >"$OUT/bench_fast_${val}_$rep.txt" 2>&1
        log "fast $V=$val rep $rep rc $?"
        grep -E "^ +[0-9]+ |batch +step|tokens +chunk" "$OUT/bench_fast_${val}_$rep.txt" | tee -a "$OUT/summary.txt"
        env "$V=$val" timeout 60 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 7 \
            --batch 1 --no-split --prefill 0 --numerics plain >"$OUT/bench_plain_${val}_$rep.txt" 2>&1
        log "plain $V=$val rep $rep rc $?"
        grep -E "^ +[0-9]+ " "$OUT/bench_plain_${val}_$rep.txt" | tee -a "$OUT/summary.txt"
    done
done
log "done"
