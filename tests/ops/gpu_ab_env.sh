#!/bin/bash
# gpu_ab_env.sh - one device run for an A/B of environment switches of the CUDA backend: build,
# every CUDA test (defaults), then `dsinfer bench layer` at context 4096 (decode at AB_BATCH, the
# 8k prefill; `fast` numerics, and `plain` at batch 1) for each variant in AB_VARIANTS (a word
# per variant: "base" = the defaults, else comma-separated VAR=value settings), the variants
# alternated, AB_REPS rounds. AB_TEST_ENV (VAR=value,...): the CUDA tests once more with those
# settings; AB_PLAIN=0 leaves out the `plain` batch-1 runs; AB_PROFILE=1: a per-op profile
# (DSI_CUDA_PROFILE) per variant of a decode step at batch AB_PROFILE_BATCH (1) and, with
# AB_PROFILE_PREFILL (0) tokens, a prefill; AB_LEAVE (op names or "all"): once, the defaults' decode
# steps at AB_LEAVE_BATCH (1) timed without each of those ops (bench layer --leave-out: each op's
# cost inside the step). Key lines in $OUT/summary.txt, the logs in $OUT/logs.tgz. Usage (repository root, on the GPU machine):
#   OUT=$OUT AB_VARIANTS="base DSI_CUDA_PDL=0 DSI_CUDA_GROUPED=0" bash tests/ops/gpu_ab_env.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
L=/tmp/ab-logs
rm -rf $L && mkdir -p "$OUT" $L
. tests/ops/gpu_env.sh
VARIANTS=${AB_VARIANTS:-base DSI_CUDA_PDL=0 DSI_CUDA_GROUPED=0}
BATCH=${AB_BATCH:-1,8,32,128,256}
PREFILL=${AB_PREFILL:-8192}
start_flash4 $L
build_cuda $L
log "build done"
timeout 260 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$L/test_cuda.log" 2>&1
log "test_cuda rc $?: $(tail -1 "$L/test_cuda.log")"
grep -E "FAIL|fail[^e]" "$L/test_cuda.log" | head -20 | tee -a "$OUT/summary.txt"
if [ -n "${AB_TEST_ENV:-}" ]; then
    IFS=, read -ra tenv <<<"$AB_TEST_ENV"
    env "${tenv[@]}" timeout 200 build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$L/test_cuda_env.log" 2>&1
    log "test_cuda with $AB_TEST_ENV rc $?: $(tail -1 "$L/test_cuda_env.log")"
    grep -E "FAIL|fail[^e]" "$L/test_cuda_env.log" | head -20 | tee -a "$OUT/summary.txt"
fi
wait $GEN
log "checkpoint: $(tail -1 "$L/gen.log")"
for rep in $(seq 1 "${AB_REPS:-2}"); do
    for v in $VARIANTS; do
        envs=()
        [ "$v" != base ] && IFS=, read -ra envs <<<"$v"
        f="$L/bench_${v//[=,]/_}_$rep"
        env "${envs[@]}" timeout 120 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 7 \
            --batch "$BATCH" --no-split --prefill "$PREFILL" --prefill-reps 1 --numerics fast >"$f.fast.txt" 2>&1
        log "fast $v rep $rep rc $?"
        grep -E "^ +[0-9]+ |tokens +chunk" "$f.fast.txt" | tee -a "$OUT/summary.txt"
        [ "${AB_PLAIN:-1}" = 0 ] && continue # AB_PLAIN=0: no `plain` batch-1 run
        env "${envs[@]}" timeout 60 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 7 \
            --batch 1 --no-split --prefill 0 --numerics plain >"$f.plain.txt" 2>&1
        log "plain $v rep $rep rc $?"
        grep -E "^ +[0-9]+ " "$f.plain.txt" | tee -a "$OUT/summary.txt"
    done
done
if [ -n "${AB_PROFILE:-}" ]; then
    for v in $VARIANTS; do
        envs=()
        [ "$v" != base ] && IFS=, read -ra envs <<<"$v"
        env "${envs[@]}" DSI_CUDA_PROFILE=1 timeout 100 build/cuda/dsinfer bench layer -m $M --ctx 4096 \
            --steps 5 --batch "${AB_PROFILE_BATCH:-1}" --no-split --prefill "${AB_PROFILE_PREFILL:-0}" \
            --prefill-reps 1 --numerics fast >"$L/profile_${v//[=,]/_}.txt" 2>&1
        log "profile $v rc $?"
    done
fi
if [ -n "${AB_LEAVE:-}" ]; then
    timeout 300 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 7 \
        --batch "${AB_LEAVE_BATCH:-1}" --no-split --prefill 0 --numerics fast \
        --leave-out "$AB_LEAVE" >"$L/leave.txt" 2>&1
    log "leave-out rc $?"
    grep -E "^ +[0-9]+ |without" "$L/leave.txt" | tee -a "$OUT/summary.txt"
fi
tar czf "$OUT/logs.tgz" -C $L .
log "done"
