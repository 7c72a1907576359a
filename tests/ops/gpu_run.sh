#!/bin/bash
# gpu_run.sh - one full device run (see docs/cuda.md): build with CUDA=1, the CUDA op + model
# tests, compute-sanitizer memcheck on the tiny op tests, the CLI check, and the layer
# benchmark on a real-shape random checkpoint generated here (in the background, while the
# tests run). Logs under $OUT. Usage (repository root, on the GPU machine):
#   bash tests/ops/gpu_run.sh [all|tests|bench]
set -u
MODE=${1:-all}
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
J=$(nproc)
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi -L 2>&1 | tee -a "$OUT/summary.txt"
log "nvcc: $(nvcc --version | tail -1)"
# jansson / pcre2: use the system's, or the copies carried in build/deps
if [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/include/pcre2.h ]; then
    log "using carried build/deps (no jansson/pcre2 dev files here)"
    export CFLAGS="-O2 -g -I$PWD/build/deps/include" LDFLAGS="-L$PWD/build/deps/lib"
    export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
fi
# BENCH_SET="--set n_routed_experts=16 ..." makes a smaller real-shape checkpoint (faster to write)
BENCH_MODEL=/tmp/flash4
BENCH_BATCH=${BENCH_BATCH:-1,2,4,8,16,32,64,128,256}
if [ "$MODE" != tests ] && [ ! -f $BENCH_MODEL/config.json ]; then
    (python3 ref/make_checkpoint.py --preset flash --layers 4 ${BENCH_SET:-} --out $BENCH_MODEL >"$OUT/gen.log" 2>&1;
     echo "gen exit $?" >>"$OUT/gen.log") &
    GEN=$!
fi
t0=$(date +%s)
make -j"$J" BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/libdsinfer.a >"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; log "BUILD FAILED"; exit 1; }
make -j"$J" BUILD=build/cuda CUDA=1 build/cuda/dsinfer >>"$OUT/build.log" 2>&1 || log "dsinfer did not link (other modules); CLI check skipped"
log "build $(( $(date +%s) - t0 )) s"
if [ "$MODE" != bench ]; then
    t0=$(date +%s)
    timeout 240 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$OUT/test_cuda.log" 2>&1
    log "test_cuda rc $? ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/test_cuda.log")"
    cat "$OUT/test_cuda.log"
    if [ -x build/cuda/dsinfer ]; then
        DSINFER=build/cuda/dsinfer timeout 120 sh tests/cli/t_cuda.sh >"$OUT/t_cuda.log" 2>&1
        log "t_cuda.sh rc $?: $(tail -3 "$OUT/t_cuda.log" | tr '\n' ' ')"
    fi
    t0=$(date +%s)
    DSI_TEST_TINY=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 20 \
        build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$OUT/memcheck.log" 2>&1
    log "memcheck rc $? ($(( $(date +%s) - t0 )) s): $(grep -E 'ERROR SUMMARY|passed' "$OUT/memcheck.log" | tr '\n' ' ')"
fi
if [ "$MODE" != tests ]; then
    cc -std=c11 -O2 -D_GNU_SOURCE -DDSI_CUDA -DDSI_BENCH_LAYER_MAIN -Iinclude -Isrc ${CFLAGS:-} \
        -o build/cuda/bench_layer tools/cmd_bench_layer.c build/cuda/libdsinfer.a ${LDFLAGS:-} \
        -L/usr/local/cuda/lib64 -ljansson -lpcre2-8 -lpthread -lm -lcudart -lstdc++ 2>&1 | tail -5
    [ -n "${GEN:-}" ] && { wait $GEN; tail -2 "$OUT/gen.log"; }
    timeout 150 build/cuda/bench_layer -m $BENCH_MODEL --ctx 4096 --steps 5 \
        --batch $BENCH_BATCH 2>&1 | tee "$OUT/bench_layer.txt"
    log "bench rc ${PIPESTATUS[0]}"
    for b in ${BENCH_PROFILE:-}; do  # per-op GPU time at these batch sizes
        DSI_CUDA_PROFILE=1 timeout 60 build/cuda/bench_layer -m $BENCH_MODEL --ctx 4096 --steps 5 \
            --batch $b >"$OUT/profile_b$b.txt" 2>&1
        cat "$OUT/profile_b$b.txt"
    done
fi
cat "$OUT/summary.txt"
