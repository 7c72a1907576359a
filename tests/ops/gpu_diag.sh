#!/bin/bash
# gpu_diag.sh - where a batch-1 decode step's kernels lose their time, on a short device budget:
# build dsinfer only, a 4-layer V4-Flash-shaped checkpoint with DIAG_EXPERTS routed experts (16:
# seconds to write; a batch-1 step still runs 6 of them, the same kernel shapes), then Nsight
# Compute (--clock-control none, as the device notes ask) on the kernels matching DIAG_KERNELS
# (DIAG_KERNELS=none: none of them; with DIAG_SRC, only the source pass below):
# speed of light (DRAM and SM throughput), warp states (stall reasons), occupancy, launch
# statistics; a second pass for the stall reasons per issued instruction. Output in
# $OUT/diag.txt and $OUT/diag_stalls.txt. DIAG_BATCH (default 1): the decode batch; with 16
# experts, DIAG_BATCH=16 gives the routed tiles of a 256-batch step of the real model (6 rows
# per expert): DIAG_BATCH=16 DIAG_KERNELS=k_tc for tc.cu's MoE tiles. DIAG_PREFILL (0): the
# tokens of a prefill the bench runs after the decode steps (e.g. 8192 with DIAG_KERNELS=k_attn);
# DIAG_DEMANGLED=1: DIAG_KERNELS / DIAG_SRC match the demangled names, template arguments and all
# (written as ncu prints them: 'k_gvf<\(int\)1, \(int\)4'). Usage (repository root,
# on the GPU machine; DIAG_M: an existing checkpoint to use instead, e.g. gpu_ab_env.sh's /tmp/flash4;
# an existing build/cuda/dsinfer is used as it is):
#   OUT=$OUT bash tests/ops/gpu_diag.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
. tests/ops/gpu_env.sh
M=${DIAG_M:-/tmp/flash4d}
D="$OUT/diag.txt"
[ -f $M/config.json ] || (python3 ref/make_checkpoint.py --preset flash --layers 4 --no-verify \
    --set n_routed_experts=${DIAG_EXPERTS:-16} --out $M >/tmp/diag-gen.log 2>&1
 echo "gen exit $?" >>/tmp/diag-gen.log) &
GEN=$!
[ -x build/cuda/dsinfer ] || make -j"$(nproc)" BUILD=build/cuda CUDA=1 build/cuda/dsinfer >/tmp/diag-build.log 2>&1 ||
    { tail -30 /tmp/diag-build.log; log "BUILD FAILED"; exit 1; }
log "build done"
wait $GEN
log "checkpoint: $(tail -1 /tmp/diag-gen.log)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NB=(); [ "${DIAG_DEMANGLED:-0}" = 1 ] && NB=(--kernel-name-base demangled)
PF=${DIAG_PREFILL:-0}
log "ncu: ${NCU:-none}"
[ -n "$NCU" ] || exit 0
DSI_CUDA_NOGRAPH=1 timeout ${DIAG_TIMEOUT:-150} "$NCU" --clock-control none "${NB[@]}" \
    -k "regex:${DIAG_KERNELS:-k_moe_up_gv|k_moe_down_gv|k_gvf}" \
    --launch-skip ${DIAG_SKIP:-40} --launch-count ${DIAG_COUNT:-10} --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 2 \
    --batch ${DIAG_BATCH:-1} --no-split --prefill $PF --prefill-reps 1 --numerics fast >"$D" 2>&1
log "ncu rc $?"
# stall reasons per issued instruction (a second pass: a metric this ncu lacks fails only it)
DSI_CUDA_NOGRAPH=1 timeout ${DIAG_TIMEOUT:-150} "$NCU" --clock-control none "${NB[@]}" \
    -k "regex:${DIAG_KERNELS:-k_moe_up_gv|k_moe_down_gv|k_gvf}" \
    --launch-skip ${DIAG_SKIP:-40} --launch-count ${DIAG_COUNT:-10} \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 2 --batch ${DIAG_BATCH:-1} --no-split \
    --prefill $PF --prefill-reps 1 --numerics fast >"$OUT/diag_stalls.txt" 2>&1
log "ncu stalls rc $?"
# DIAG_SRC (a kernel regex): per SASS instruction, the warp stall samples of DIAG_SRC_COUNT (2)
# launches of those kernels after DIAG_SRC_SKIP (10) (ncu's source page, CSV) in $OUT/diag_src.csv
if [ -n "${DIAG_SRC:-}" ]; then
    DSI_CUDA_NOGRAPH=1 timeout ${DIAG_TIMEOUT:-150} "$NCU" --clock-control none "${NB[@]}" -k "regex:$DIAG_SRC" \
        --launch-skip ${DIAG_SRC_SKIP:-10} --launch-count ${DIAG_SRC_COUNT:-2} --section SourceCounters \
        --section WarpStateStats --page source --print-source sass --csv build/cuda/dsinfer bench layer \
        -m $M --ctx 4096 --steps 2 --batch ${DIAG_BATCH:-1} --no-split --prefill $PF --prefill-reps 1 --numerics fast \
        >"$OUT/diag_src.csv" 2>&1
    log "ncu source rc $?"
fi
grep -E "^  k_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall|L2 Hit|Mem Busy|Max Bandwidth" "$D" | head -150 >>"$OUT/summary.txt"
log "done"
