#!/bin/bash
# gpu_fast.sh - one device run for the `fast` numerics profile (tensor-core GEMMs, tc.cu):
# build, the fast op and model tests then every CUDA test, the layer benchmark on a real-shape
# 4-layer checkpoint in plain, reference and fast numerics (decode at FAST_BATCH, 8k prefill),
# a per-op profile of fast decode at batch 256 and of the fast prefill, memcheck and racecheck
# on the fast op tests. Logs under $OUT (summary.txt has the key lines). Usage (repository
# root, on the GPU machine; carry build/deps where jansson/pcre2 dev files are missing):
#   OUT=$OUT bash tests/ops/gpu_fast.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
L=/tmp/fast-logs
rm -rf $L && mkdir -p $L
T0=$(date +%s)
log() { echo "== [$(($(date +%s) - T0))s] $*" | tee -a $L/summary.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a $L/summary.txt
if [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/include/pcre2.h ]; then
    export CFLAGS="-O2 -g -I$PWD/build/deps/include" LDFLAGS="-L$PWD/build/deps/lib"
    export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
fi
M=/tmp/flash4
if [ ! -f $M/config.json ]; then
    (python3 ref/make_checkpoint.py --preset flash --layers 4 --no-verify --out $M >$L/gen.log 2>&1
     echo "gen exit $?" >>$L/gen.log) &
    GEN=$!
fi
J=$(nproc)
make -j$J BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/libdsinfer.a >$L/build.log 2>&1 ||
    { tail -30 $L/build.log; log "BUILD FAILED"; exit 1; }
make -j$J BUILD=build/cuda CUDA=1 build/cuda/dsinfer >>$L/build.log 2>&1
if [ -x build/cuda/dsinfer ]; then
    BL="build/cuda/dsinfer bench layer"
else
    cc -std=c11 -O2 -D_GNU_SOURCE -DDSI_CUDA -DDSI_BENCH_LAYER_MAIN -Iinclude -Isrc ${CFLAGS:-} \
        -o build/cuda/bench_layer tools/cmd_bench_layer.c tools/args.c build/cuda/src/backend/cuda/peak.o \
        build/cuda/libdsinfer.a ${LDFLAGS:-} -L/usr/local/cuda/lib64 -ljansson -lpcre2-8 -lpthread -lm \
        -lcublasLt -lcublas -lcudart -lstdc++ 2>&1 | tail -5
    BL=build/cuda/bench_layer
fi
log "build done ($BL)"
for t in test_cuda_gemm_fast test_cuda_moe_fast test_cuda_attn 'test_cuda_model_*'; do
    timeout 120 build/cuda/dsinfer-test --root . --only "$t" >$L/test_$t.log 2>&1
    log "$t rc $?: $(tail -1 $L/test_$t.log)"
    grep -oE "\[[^]]*(fast|differ)[^]]*\]" $L/test_$t.log | head -30 | tee -a $L/summary.txt
done
# which kernel moves tiny-a's fast logits: each of gvf.cu and attn_tc.cu alone
for v in "1 0 1 0" "1 0 99999 32" "1 0 99999 0" "64 4 128 32"; do
    set -- $v
    DSI_CUDA_TC_DENSE=$1 DSI_CUDA_TC_MOE=$2 DSI_CUDA_TC_ATTN=$3 DSI_CUDA_GVF=$4 timeout 60 \
        build/cuda/dsinfer-test --root . --only test_cuda_model_tiny_a >$L/variant.log 2>&1
    log "tiny-a TC_DENSE=$1 TC_MOE=$2 TC_ATTN=$3 GVF=$4: $(grep -oE '\[tiny-a fast[^]]*\]' $L/variant.log | tr '\n' ' ')"
done
timeout 240 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >$L/test_cuda.log 2>&1
log "all test_cuda rc $?: $(tail -1 $L/test_cuda.log)"
grep -E "FAIL|fail" $L/test_cuda.log | head -20 | tee -a $L/summary.txt
[ -n "${GEN:-}" ] && { wait $GEN; log "checkpoint: $(tail -1 $L/gen.log)"; }
B=${FAST_BATCH:-1,8,64,256}
for num in ${FAST_NUMS:-fast plain}; do
    timeout 150 $BL -m $M --ctx 4096 --steps 5 --batch $B --no-split --prefill 8192 \
        --prefill-reps 1 --numerics $num >$L/bench_$num.txt 2>&1
    log "bench $num rc $?"
    grep -E "^ +[0-9]+ |batch +step|tokens +chunk|copy bandwidth" $L/bench_$num.txt | tee -a $L/summary.txt
done
# A/B in the same run: the decode kernels off (batch 1, 8), the routed experts on them
# instead of tc.cu (batch 64, 256)
DSI_CUDA_GVF=0 timeout 100 $BL -m $M --ctx 4096 --steps 5 --batch 1,8 --no-split --prefill 0 \
    --numerics fast >$L/bench_fast_nogvf.txt 2>&1
log "bench fast DSI_CUDA_GVF=0 rc $?"
grep -E "^ +[0-9]+ |batch +step" $L/bench_fast_nogvf.txt | tee -a $L/summary.txt
DSI_CUDA_TC_MOE=1000 timeout 100 $BL -m $M --ctx 4096 --steps 5 --batch 64,256 --no-split \
    --prefill 0 --numerics fast >$L/bench_fast_gvfmoe.txt 2>&1
log "bench fast DSI_CUDA_TC_MOE=1000 rc $?"
grep -E "^ +[0-9]+ |batch +step" $L/bench_fast_gvfmoe.txt | tee -a $L/summary.txt
DSI_CUDA_PROFILE=1 timeout 120 $BL -m $M --ctx 4096 --steps 3 --batch 256 --no-split --prefill 8192 \
    --prefill-reps 1 --numerics fast >$L/bench_profile_fast.txt 2>&1
log "profile fast rc $?"
grep -A45 "# profile" $L/bench_profile_fast.txt | tee -a $L/summary.txt
DSI_CUDA_PROFILE=1 timeout 60 $BL -m $M --ctx 4096 --steps 5 --batch 1 --no-split --prefill 0 \
    --numerics fast >$L/bench_profile_fast1.txt 2>&1
log "profile fast batch 1 rc $?"
grep -A45 "# profile" $L/bench_profile_fast1.txt | tee -a $L/summary.txt
DSI_TEST_TINY=1 timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
    build/cuda/dsinfer-test --root . --only 'test_cuda_*' >$L/memcheck.log 2>&1
log "memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed' $L/memcheck.log | tr '\n' ' ')"
for t in test_cuda_gemm_fast test_cuda_moe_fast test_cuda_attn; do
    DSI_TEST_TINY=1 timeout 60 compute-sanitizer --tool racecheck --print-limit 10 \
        build/cuda/dsinfer-test --root . --only $t >$L/racecheck_$t.log 2>&1
    log "racecheck $t rc $?: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|passed' $L/racecheck_$t.log | tr '\n' ' ')"
done
if [ -x build/cuda/dsinfer ]; then
    DSINFER=build/cuda/dsinfer timeout 200 sh tests/cli/t_cuda.sh >$L/t_cuda.log 2>&1
    log "t_cuda.sh rc $?: $(tail -4 $L/t_cuda.log | tr '\n' ' ')"
fi
log "done"
cp $L/summary.txt $L/bench_*.txt "$OUT/" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C /tmp fast-logs
