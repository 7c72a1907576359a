#!/bin/bash
# gpu_run.sh - one full device run (see docs/cuda.md): build with CUDA=1, the CUDA op + model
# tests, compute-sanitizer memcheck on the tiny op tests, the CLI check, and the layer
# benchmark on a real-shape random checkpoint generated here (in the background, while the
# tests run): HF transformers eager on the same shapes (ref/hf_layer_bench.py), then
# `dsinfer bench layer` (decode at BENCH_CTX x BENCH_BATCH, per-layer split, 43-layer
# projection, 8k prefill, rooflines and the HF ratio). Logs under $OUT. Usage (repository root,
# on the GPU machine):
#   bash tests/ops/gpu_run.sh [all|tests|bench]
# Bench part: under 5 min of device time after the build (timeouts: HF 120 s, bench layer 180 s;
# expected ~40 s and ~60-90 s).
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
# BENCH_NUMERICS=fast|reference|plain picks the numerics of the CUDA runs (default: the tool's).
# BENCH_SET="--set n_routed_experts=16 ..." makes a smaller real-shape checkpoint (faster to write)
BENCH_MODEL=/tmp/flash4
BENCH_BATCH=${BENCH_BATCH:-1,2,4,8,16,32,64,128,256}
BENCH_CTX=${BENCH_CTX:-4096,65536}
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
    # HF transformers eager, same shapes (bf16, random weights made on the GPU; ~54 GB), decode at
    # context 4096 and one 8k prefill; needs no checkpoint, so it runs while the writer may still
    # be busy (CPU only). Its table goes to bench_layer.txt, its JSON to /tmp (file count of $OUT).
    HF_JSON=/tmp/hf_layer.json
    rm -f $HF_JSON
    gen_busy=no; [ -n "${GEN:-}" ] && kill -0 $GEN 2>/dev/null && gen_busy=yes
    tb=$(date +%s)
    PYTHONUNBUFFERED=1 timeout 120 python3 ref/hf_layer_bench.py --preset flash --layers 4 ${BENCH_SET:-} \
        --ctx 4096 --batch $BENCH_BATCH --prefill 8192 --budget 90 --out $HF_JSON \
        >"$OUT/bench_layer.txt" 2>&1
    log "hf_layer_bench rc $? ($(( $(date +%s) - tb )) s, checkpoint writer running at start: $gen_busy): $(tail -1 "$OUT/bench_layer.txt")"
    if [ -x build/cuda/dsinfer ]; then
        BL="build/cuda/dsinfer bench layer"
    else # standalone (weak peak symbols: link peak.o and cuBLASLt explicitly)
        cc -std=c11 -O2 -D_GNU_SOURCE -DDSI_CUDA -DDSI_BENCH_LAYER_MAIN -Iinclude -Isrc ${CFLAGS:-} \
            -o build/cuda/bench_layer tools/cmd_bench_layer.c tools/args.c build/cuda/src/backend/cuda/peak.o \
            build/cuda/libdsinfer.a ${LDFLAGS:-} -L/usr/local/cuda/lib64 -ljansson -lpcre2-8 -lpthread \
            -lm -lcublasLt -lcublas -lcudart -lstdc++ 2>&1 | tail -5
        BL=build/cuda/bench_layer
    fi
    [ -n "${GEN:-}" ] && { wait $GEN; tail -2 "$OUT/gen.log"; }
    tb=$(date +%s)
    timeout 180 $BL -m $BENCH_MODEL --ctx $BENCH_CTX --steps 5 --batch $BENCH_BATCH --prefill 8192 \
        --prefill-reps 1 --budget 150 --hf $HF_JSON ${BENCH_NUMERICS:+--numerics $BENCH_NUMERICS} 2>&1 |
        tee -a "$OUT/bench_layer.txt"
    log "bench rc ${PIPESTATUS[0]} ($(( $(date +%s) - tb )) s)"
    grep -E '^#  (batch|prefill|1 request|256 requests)' "$OUT/bench_layer.txt" | tee -a "$OUT/summary.txt"
    [ -f $HF_JSON ] && { echo "# $HF_JSON:"; cat $HF_JSON; } >>"$OUT/bench_layer.txt"
    for b in ${BENCH_PROFILE:-}; do  # per-op GPU time at these batch sizes
        DSI_CUDA_PROFILE=1 timeout 60 $BL -m $BENCH_MODEL --ctx 4096 --steps 5 --batch $b \
            --no-split --prefill 0 ${BENCH_NUMERICS:+--numerics $BENCH_NUMERICS} >"$OUT/profile_b$b.txt" 2>&1
        cat "$OUT/profile_b$b.txt"
    done
fi
cat "$OUT/summary.txt"
