#!/bin/bash
# gpu_sweep.sh - one device run of `dsinfer bench layer` decode steps (ctx 4096, `fast` numerics)
# for each variant in SW_VARIANTS (a word per variant: "base" = the defaults, else comma-separated
# VAR=value settings of the CUDA backend), alternated, SW_REPS rounds (2), at the batches
# SW_BATCH (1); no tests, no prefill: a quick sweep of switches. Builds dsinfer and writes the
# 4-layer V4-Flash-shaped checkpoint at the same time: SW_M (/tmp/flash4d) with SW_SET's
# make_checkpoint.py settings (default "--set n_routed_experts=16": seconds to write; SW_SET=""
# and SW_M=/tmp/flash4 for the real 256 experts, ~2 minutes). "step_ms" per variant and batch in
# $OUT/summary.txt. Usage (repository root, on the GPU machine):
#   OUT=$OUT SW_VARIANTS="base DSI_CUDA_GVF_BLOCKS=16" SW_BATCH=32,256 bash tests/ops/gpu_sweep.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
. tests/ops/gpu_env.sh
M=${SW_M:-/tmp/flash4d}
if [ ! -f "$M/config.json" ]; then
    # shellcheck disable=SC2086 # SW_SET is a list of arguments
    python3 ref/make_checkpoint.py --preset flash --layers 4 --no-verify ${SW_SET---set n_routed_experts=16} \
        --out "$M" >/tmp/sw-gen.log 2>&1 &
fi
make -j"$(nproc)" BUILD=build/cuda CUDA=1 build/cuda/dsinfer >/tmp/sw-build.log 2>&1 ||
    { tail -30 /tmp/sw-build.log; log "BUILD FAILED"; exit 1; }
wait
log "build and checkpoint done: $(tail -1 /tmp/sw-gen.log 2>/dev/null)"
for rep in $(seq 1 "${SW_REPS:-2}"); do
    for v in ${SW_VARIANTS:-base}; do
        envs=()
        [ "$v" != base ] && IFS=, read -ra envs <<<"$v"
        env "${envs[@]}" timeout 60 build/cuda/dsinfer bench layer -m "$M" --ctx 4096 --steps 9 \
            --batch "${SW_BATCH:-1}" --no-split --prefill 0 --numerics fast >/tmp/sw.txt 2>&1
        log "$v rep $rep rc $?"
        grep -E "^ +[0-9]+ " /tmp/sw.txt | awk '{print "   ", $1, $2}' | tee -a "$OUT/summary.txt"
    done
done
