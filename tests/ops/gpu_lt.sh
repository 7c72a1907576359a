#!/bin/bash
# gpu_lt.sh - one device run for lt.cu (dense FP8 GEMMs through cuBLASLt): build, find the
# scale-tensor layout cuBLASLt reads (test_cuda_gemm_fast under DSI_CUDA_LT_LAYOUT 1, 0, 2, 3
# until one passes; the others must fail: a wrong layout scales the blocks wrongly; the per-op
# profile shows whether lt.cu was taken at all), every CUDA
# test with it, then `dsinfer bench layer` (context 4096, decode at LT_BATCH, the 8k prefill,
# `fast` numerics) with lt.cu on and off (DSI_CUDA_LT_MIN=0), alternated, LT_REPS rounds, and a
# per-op profile of the prefill with it on; with build/variants/base (a whole src/backend/cuda,
# carried with build/deps) that tree is built and benched too, as `base`. Key lines in $OUT/summary.txt, logs in
# $OUT/logs.tgz. Usage (repository root, GPU machine): OUT=$OUT bash tests/ops/gpu_lt.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
L=/tmp/lt-logs
rm -rf $L && mkdir -p "$OUT" $L
. tests/ops/gpu_env.sh
start_flash4 $L
build_cuda $L
log "build done"
BASE=
if [ -d build/variants/base ]; then # a baseline: this tree with build/variants/base as src/backend/cuda
    BASE=/tmp/v_base
    rm -rf $BASE && mkdir -p $BASE && cp -a Makefile include src tools tests ref build $BASE/ 2>/dev/null
    rm -f $BASE/src/backend/cuda/* && cp build/variants/base/* $BASE/src/backend/cuda/ && touch $BASE/src/backend/cuda/*
    (cd $BASE && make -j"$(nproc)" BUILD=build/cuda CUDA=1 build/cuda/dsinfer >"$L/build_base.log" 2>&1
     echo $? >"$L/build_base.rc") &
    BB=$!
fi
T=build/cuda/dsinfer-test
LAY=
for l in 1 0 2 3; do
    DSI_CUDA_PROFILE=1 DSI_CUDA_LT_LAYOUT=$l timeout 100 $T --root . --only test_cuda_gemm_fast \
        >"$L/probe_$l.log" 2>&1
    rc=$?
    log "test_cuda_gemm_fast with DSI_CUDA_LT_LAYOUT=$l rc $rc: $(grep -o '\[1024 x 4096\] n 520[^]]*]' "$L/probe_$l.log" | head -1) $(grep -E '^gemm.lt ' "$L/probe_$l.log" | head -1)"
    [ $rc = 0 ] && [ -z "$LAY" ] && LAY=$l
done
grep -h "cuBLASLt" "$L"/probe_*.log | sort | uniq -c | head -5 | tee -a "$OUT/summary.txt"
log "layout: ${LAY:-none}"
export DSI_CUDA_LT_LAYOUT=${LAY:-1}
timeout 200 $T --root . --only 'test_cuda_*' >"$L/test_cuda.log" 2>&1
log "test_cuda rc $?: $(tail -1 "$L/test_cuda.log")"
grep -E "FAIL|fail[^e]" "$L/test_cuda.log" | head -20 | tee -a "$OUT/summary.txt"
wait $GEN
log "checkpoint: $(tail -1 "$L/gen.log")"
VS="on off"
if [ -n "$BASE" ]; then
    wait $BB
    log "base build rc $(cat "$L/build_base.rc")"
    [ "$(cat "$L/build_base.rc")" = 0 ] && VS="base on off"
fi
for rep in $(seq 1 "${LT_REPS:-2}"); do
    for v in $VS; do
        lm=128 bin=build/cuda/dsinfer
        [ $v = off ] && lm=0
        [ $v = base ] && bin=$BASE/build/cuda/dsinfer
        DSI_CUDA_LT_MIN=$lm timeout 150 $bin bench layer -m $M --ctx 4096 --steps 7 \
            --batch "${LT_BATCH:-1,128,256}" --no-split --prefill 8192 --prefill-reps 1 \
            --numerics fast >"$L/bench_${v}_$rep.txt" 2>&1
        log "bench lt $v rep $rep rc $?"
        grep -E "^ +[0-9]+ |tokens +chunk|^ +8192" "$L/bench_${v}_$rep.txt" | tee -a "$OUT/summary.txt"
    done
done
DSI_CUDA_PROFILE=1 timeout 100 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 5 --batch 256 \
    --no-split --prefill 8192 --prefill-reps 1 --numerics fast >"$L/profile_on.txt" 2>&1
log "profile rc $?"
grep -E "^(gemm|moe|attn|hc_pre|indexer)[a-z._]* |cuBLASLt" "$L/profile_on.txt" | tee -a "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $L .
log "done"
