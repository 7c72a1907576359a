#!/bin/bash
# gpu_ab.sh - one device run for a CUDA performance change (docs/cuda.md, "Performance"):
# builds this tree (build/cuda) and a baseline that differs only in src/backend/cuda (the files
# in $BASE_SRC, default build/base_cuda: copy them there from the commit before the change, e.g.
#   mkdir -p build/base_cuda && for f in $(git ls-tree --name-only HEAD src/backend/cuda/); do
#     git show HEAD:$f > build/base_cuda/$(basename $f); done
# and carry build/base_cuda with build/deps), runs the CUDA op and model tests on this tree, the
# layer benchmark on both (base, new, base, new, new with $AB_VAR, default DSI_CUDA_NOGEMV=1), a per-op
# profile of the timed steps at batch 1 and 64, then the CLI check and the sanitizers while time
# is left (RUN_BUDGET seconds, default 300). All logs in $OUT/logs.tgz, the key lines in
# $OUT/summary.txt and at the end of the output.
#   bash tests/ops/gpu_ab.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
L=/tmp/ab-logs
rm -rf $L && mkdir -p $L
BUDGET=${RUN_BUDGET:-300}
BASE_SRC=${BASE_SRC:-build/base_cuda}
BATCH=${BENCH_BATCH:-1,2,4,8,16,32,64,128,256}
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
log() { echo "== [$(el)s] $*" | tee -a $L/summary.txt; }
left() { [ $(($(date +%s) - T0)) -lt $((BUDGET - $1)) ]; } # at least $1 s of the budget left
finish() {
    cp $L/summary.txt "$OUT/summary.txt"
    tar -czf "$OUT/logs.tgz" -C /tmp ab-logs
    cat $L/summary.txt
    exit "${1:-0}"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu \
    --format=csv 2>&1 | tee -a $L/summary.txt
log "nvcc: $(nvcc --version | tail -1)"
if [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/include/pcre2.h ]; then
    export CFLAGS="-O2 -g -I$PWD/build/deps/include" LDFLAGS="-L$PWD/build/deps/lib"
    export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
fi
M=/tmp/flash4
if [ ! -f $M/config.json ]; then
    (python3 ref/make_checkpoint.py --preset flash --layers 4 --out $M >$L/gen.log 2>&1
     echo "gen exit $?" >>$L/gen.log) &
    GEN=$!
fi
# the baseline tree: this one with the old src/backend/cuda
B=/tmp/base
rm -rf $B && mkdir -p $B && cp -r Makefile include src tools tests $B/ && rm -f $B/src/backend/cuda/* &&
    cp $BASE_SRC/* $B/src/backend/cuda/ || { log "no baseline sources in $BASE_SRC"; finish 1; }
(make -C $B -j8 BUILD=build/cuda CUDA=1 build/cuda/libdsinfer.a >$L/build_base.log 2>&1
 echo $? >$L/build_base.rc) &
BB=$!
make -j12 BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/libdsinfer.a >$L/build.log 2>&1 ||
    { tail -30 $L/build.log; log "BUILD FAILED"; finish 1; }
make -j12 BUILD=build/cuda CUDA=1 build/cuda/dsinfer >>$L/build.log 2>&1 || log "dsinfer did not link; CLI check skipped"
wait $BB
log "builds done (base rc $(cat $L/build_base.rc))"
bench_link() { # lib out
    cc -std=c11 -O2 -D_GNU_SOURCE -DDSI_CUDA -DDSI_BENCH_LAYER_MAIN -Iinclude -Isrc ${CFLAGS:-} \
        -o "$2" ${BENCH_SRC:-tools/cmd_bench_layer.c} tools/args.c "$1" ${LDFLAGS:-} -L/usr/local/cuda/lib64 -ljansson \
        -lpcre2-8 -lpthread -lm -lcudart -lstdc++ 2>&1 | tail -5
}
bench_link build/cuda/libdsinfer.a build/cuda/bench_layer
[ "$(cat $L/build_base.rc)" = 0 ] && bench_link $B/build/cuda/libdsinfer.a build/cuda/bench_layer_base

timeout 200 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >$L/test_cuda.log 2>&1
TRC=$?
log "test_cuda rc $TRC: $(tail -1 $L/test_cuda.log)"
grep -E "differ|FAIL|fail|rel " $L/test_cuda.log | head -40 | tee -a $L/summary.txt
if [ $TRC != 0 ] && left 200; then
    DSI_CUDA_NOSTAGE=1 timeout 150 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >$L/test_cuda_nostage.log 2>&1
    log "test_cuda with DSI_CUDA_NOSTAGE=1 rc $?: $(tail -1 $L/test_cuda_nostage.log)"
fi

[ -n "${GEN:-}" ] && { wait $GEN; log "checkpoint: $(tail -1 $L/gen.log)"; }
bench() { # name binary batches [VAR=value...]
    local name=$1 bin=$2 bs=$3
    shift 3
    env "$@" timeout 120 $bin -m $M --ctx 4096 --steps 7 --batch $bs ${BENCH_ARGS:---no-split --prefill 0} \
        >$L/bench_$name.txt 2>&1
    log "bench $name rc $?"
}
if [ -x build/cuda/bench_layer_base ]; then
    bench base1 build/cuda/bench_layer_base $BATCH
    bench new1 build/cuda/bench_layer $BATCH
    left 100 && bench base2 build/cuda/bench_layer_base $BATCH
    left 80 && bench new2 build/cuda/bench_layer $BATCH
else
    bench new1 build/cuda/bench_layer $BATCH
fi
left 70 && bench ${AB_VAR_NAME:-nogemv} build/cuda/bench_layer $BATCH ${AB_VAR:-DSI_CUDA_NOGEMV=1}
left 60 && bench profile build/cuda/bench_layer 1,64 DSI_CUDA_PROFILE=1
# the serving sweep on the GPU (issue 5: decode step period vs forward time at c = 64)
SWEEP=${SWEEP_CONC:-1,8,64}
if [ -x build/cuda/dsinfer ] && [ "$SWEEP" != none ] && left 120; then
    timeout 150 build/cuda/dsinfer bench sweep -m $M --backend cuda --concurrency $SWEEP \
        --input-len 128 --output-len 64 --csv $L/sweep.csv --svg $L/sweep.svg >$L/sweep.txt 2>&1
    log "sweep rc $?"
    cat $L/sweep.txt | tee -a $L/summary.txt
    cp $L/sweep.csv $L/sweep.svg "$OUT/" 2>/dev/null
    if left 90; then
        timeout 60 build/cuda/dsinfer bench sweep -m $M --backend cuda --concurrency 64 \
            --input-len 128 --output-len 64 --sampling host --csv $L/sweep_host.csv \
            --svg $L/sweep_host.svg >$L/sweep_host.txt 2>&1
        log "sweep (host sampling) rc $?"
        tail -3 $L/sweep_host.txt | tee -a $L/summary.txt
    fi
fi
if [ -x build/cuda/dsinfer ] && left 50; then
    DSINFER=build/cuda/dsinfer timeout 60 sh tests/cli/t_cuda.sh >$L/t_cuda.log 2>&1
    log "t_cuda.sh rc $?: $(tail -2 $L/t_cuda.log | tr '\n' ' ')"
fi
if left 45; then
    DSI_TEST_TINY=1 timeout $((BUDGET - $(el) - 25)) compute-sanitizer --tool memcheck --print-limit 20 \
        build/cuda/dsinfer-test --root . --only 'test_cuda_*' >$L/memcheck.log 2>&1
    log "memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed' $L/memcheck.log | tr '\n' ' ')"
fi
if left 25; then
    for t in test_cuda_gemm test_cuda_hc test_cuda_moe; do
        left 15 || break
        DSI_TEST_TINY=1 timeout 30 compute-sanitizer --tool racecheck --print-limit 10 \
            build/cuda/dsinfer-test --root . --only $t >$L/racecheck_$t.log 2>&1
        log "racecheck $t rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed' $L/racecheck_$t.log | tr '\n' ' ')"
    done
fi
for f in $L/bench_*.txt; do echo "--- $(basename $f)"; grep -E "^ +[0-9]+ |batch +step|copy bandwidth|bench layer:" $f; done |
    tee -a $L/summary.txt
grep -A40 "# profile" $L/bench_profile.txt 2>/dev/null | tee -a $L/summary.txt
finish 0
