#!/bin/bash
# gpu_final.sh - the closing device run of a session on the `fast` numerics path, lean enough for
# ~5 minutes: build, every CUDA test (op parity, whole model, fast numerics), HF transformers
# eager on the same shapes (ref/hf_layer_bench.py), the full `dsinfer bench layer --numerics
# fast` (decode at context 4096, per-layer split, 43-layer projection, 8k prefill, rooflines and
# the HF ratio), memcheck and racecheck on the tiny op tests, the CLI check (t_cuda.sh); with
# FINAL_DIAG=1 a per-op profile of batch 1 and Nsight Compute on its decode kernels; FINAL_HF=0
# leaves HF out, FINAL_CTX / FINAL_BATCH narrow the bench, FINAL_BENCH=0 runs the checks only,
# FINAL_TESTS=0 leaves out the CUDA tests (run before by gpu_ab_env.sh in the same command),
# FINAL_SAN=0 the sanitizers and the CLI check, FINAL_CLI=0 the CLI check only (the SASS instruction mixes of gvf.o, wg.o and
# attn_fa.o go to $OUT/sass_*.txt in every run), FINAL_KEEP_CKPT=1 keeps a checkpoint already in
# /tmp/flash4 (written by gpu_ab_env.sh / gpu_ab_trees.sh in the same command);
# FINAL_RACE_TIMEOUT (60 s, a racecheck run), FINAL_TEST_TIMEOUT (260 s) and FINAL_BUDGET (the bench's --budget, 150 s) for short runs;
# FINAL_PRE=1: no build, the binaries of build/pre/pre.txz (tests/ops/gpu_pre.sh --pack here;
# carry build/pre and build/deps; the SASS mixes below then need the objects and are skipped). Key
# lines in $OUT/summary.txt, the logs packed in $OUT/logs_final.tgz (KEEP_OUT=1: left as files). Usage (repository root, on the GPU machine; carry build/deps where jansson/pcre2
# dev files are missing):
#   OUT=$OUT bash tests/ops/gpu_final.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
. tests/ops/gpu_env.sh
M=/tmp/flash4
B=${FINAL_BATCH:-1,8,32,128,256}
[ "${FINAL_BENCH:-1}" = 0 ] && FINAL_HF=0 # FINAL_BENCH=0: the tests and checks only
GEN=
if [ "${FINAL_BENCH:-1}" != 0 ] && [ -f $M/config.json ] && [ "${FINAL_KEEP_CKPT:-0}" = 1 ]; then
    log "checkpoint kept: $M (written by an earlier script in the same command)"
elif [ "${FINAL_BENCH:-1}" != 0 ]; then
    (python3 ref/make_checkpoint.py --preset flash --layers 4 --no-verify --out $M >/tmp/final-gen.log 2>&1
     echo "gen exit $?" >>/tmp/final-gen.log) &
    GEN=$!
fi
J=$(nproc)
if [ "${FINAL_PRE:-0}" = 1 ]; then # binaries built on the development machine (gpu_pre.sh --pack)
    export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
    mkdir -p build/cuda && tar xJf build/pre/pre.txz -C build/cuda || { log "no build/pre/pre.txz"; exit 1; }
    log "binaries unpacked (build/pre)"
else
    make -j$J BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/dsinfer >/tmp/final-build.log 2>&1 ||
        { tail -30 /tmp/final-build.log; log "BUILD FAILED"; exit 1; }
    log "build done"
fi
# the instruction mix of the hot kernels (tests/ops/sass_hist.sh: static counts per HMMA), for
# the record of what each kernel spends beside its tensor-core instructions
[ "${FINAL_PRE:-0}" = 1 ] || for o in gvf wg attn_fa; do
    bash tests/ops/sass_hist.sh build/cuda/src/backend/cuda/$o.o >"$OUT/sass_$o.txt" 2>&1 || true
done
if [ "${FINAL_TESTS:-1}" != 0 ]; then # FINAL_TESTS=0: the CUDA tests ran already (gpu_ab_env.sh)
    timeout ${FINAL_TEST_TIMEOUT:-260} build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$OUT/test_cuda.log" 2>&1
    log "test_cuda rc $?: $(tail -1 "$OUT/test_cuda.log")"
    grep -oE "\[[^]]*(fast|FAIL)[^]]*\]|FAIL.*" "$OUT/test_cuda.log" | head -40 | tee -a "$OUT/summary.txt"
fi
# the sanitizers and the CLI check while the checkpoint is written (FINAL_SAN=0: not here)
if [ "${FINAL_SAN:-1}" != 0 ]; then
    DSI_TEST_TINY=1 timeout 120 compute-sanitizer --tool memcheck --print-limit 20 \
        build/cuda/dsinfer-test --root . --only 'test_cuda_*' >"$OUT/memcheck.log" 2>&1
    log "memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed' "$OUT/memcheck.log" | tr '\n' ' ')"
    for t in test_cuda_gemm_fast test_cuda_moe_fast test_cuda_attn; do
        DSI_TEST_TINY=1 timeout ${FINAL_RACE_TIMEOUT:-60} compute-sanitizer --tool racecheck --print-limit 10 \
            build/cuda/dsinfer-test --root . --only $t >"$OUT/racecheck_$t.log" 2>&1
        log "racecheck $t rc $?: $(grep -E 'RACECHECK SUMMARY|passed' "$OUT/racecheck_$t.log" | tr '\n' ' ')"
    done
    if [ "${FINAL_CLI:-1}" != 0 ]; then # FINAL_CLI=0: the sanitizers only
        DSINFER=build/cuda/dsinfer timeout 100 sh tests/cli/t_cuda.sh >"$OUT/t_cuda.log" 2>&1
        log "t_cuda.sh rc $?: $(tail -4 "$OUT/t_cuda.log" | tr '\n' ' ')"
    fi
fi
HF=()
if [ "${FINAL_HF:-1}" != 0 ]; then # FINAL_HF=0: no HF eager run (a short device budget)
    HF_JSON=/tmp/hf_layer.json
    PYTHONUNBUFFERED=1 timeout 120 python3 ref/hf_layer_bench.py --preset flash --layers 4 \
        --ctx 4096 --batch $B --prefill 8192 --budget 90 --out $HF_JSON >"$OUT/bench_layer.txt" 2>&1
    log "hf_layer_bench rc $?: $(tail -1 "$OUT/bench_layer.txt")"
    HF=(--hf "$HF_JSON")
fi
if [ "${FINAL_BENCH:-1}" != 0 ]; then
    [ -n "$GEN" ] && wait $GEN && log "checkpoint: $(tail -1 /tmp/final-gen.log)"
    timeout 200 build/cuda/dsinfer bench layer -m $M --ctx ${FINAL_CTX:-4096,65536} --steps 5 --batch $B --prefill 8192 \
        --prefill-reps 1 --budget ${FINAL_BUDGET:-150} "${HF[@]}" --numerics fast 2>&1 | tee -a "$OUT/bench_layer.txt" |
        grep -E "^ +[0-9]+ |batch +step|tokens +chunk|^#  " | tee -a "$OUT/summary.txt"
    log "bench layer fast rc ${PIPESTATUS[0]}"
fi
if [ -n "${FINAL_DIAG:-}" ] && [ "${FINAL_BENCH:-1}" != 0 ]; then # where batch 1's time goes: per-op events, then ncu on kernels
    D="$OUT/diag.txt"
    DSI_CUDA_PROFILE=1 timeout 60 build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 5 --batch 1 \
        --no-split --prefill 0 --numerics fast >"$D" 2>&1
    log "profile batch 1 rc $?"
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    echo "ncu: ${NCU:-none}" | tee -a "$OUT/summary.txt"
    if [ -n "$NCU" ]; then
        DSI_CUDA_NOGRAPH=1 timeout 60 "$NCU" -k 'regex:k_moe_up_gv|k_moe_down_gv|k_gemv|k_idx_topk|k_idx_scores|k_hc_pre_finish|k_attn' \
            --launch-skip 60 --launch-count 12 --section SpeedOfLight --section Occupancy \
            --section LaunchStats --section WarpStateStats build/cuda/dsinfer bench layer -m $M --ctx 4096 \
            --steps 2 --batch 1 --no-split --prefill 0 --numerics fast >>"$D" 2>&1
        log "ncu rc $?"
    fi
fi
log "done"
[ "${KEEP_OUT:-0}" = 1 ] || pack_out logs_final # (KEEP_OUT=1: the files left as they are)
