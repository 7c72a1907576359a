#!/bin/bash
# gpu_ktime.sh - every kernel of the decode steps of `dsinfer bench layer` timed one by one by
# Nsight Compute (gpu__time_duration; --clock-control none as the device notes ask; graphs off,
# so each kernel runs alone, with no launch gap or overlap): the kernels' own time, to set beside
# the step's wall time (the difference is launch gaps and dependencies). KT_CACHE (default all,
# as in step 17's runs): ncu's --cache-control; "none" keeps L2 between kernels as in a real
# step (ncu's default "all" flushes it before each kernel, so every input comes from DRAM). Uses build/cuda/dsinfer
# and the checkpoint at $M (default /tmp/flash4; both as gpu_ab_env.sh leaves them; built /
# written here when absent). KT_BATCH (default 1): the batch. Output: $OUT/ktime_b<batch>.csv
# (ncu's CSV: one line per kernel launch in launch order) and a per-kernel-name summary in
# $OUT/summary.txt (tools/ktime_sum.py). KT_DETAIL (a regex on the demangled kernel names, e.g. 'k_gvf<.int.1'): instead
# of the timing, Nsight's full section set on KT_DETAIL_COUNT (default 2) launches of the matching
# kernels after KT_DETAIL_SKIP (default 0) of them, written as $OUT/detail_b<batch>.txt (the
# details page: throughput, DRAM bytes, occupancy, stall reasons); with KT_DETAIL_SRC=1 also the
# report's raw metrics ($OUT/detail_b<batch>.raw.csv.gz: the stall reasons per issue) and source
# counters (.src.csv.gz, summarised by tools/ncu_src_sum.py into .src.txt: the samples by SASS
# block and the hottest instructions). KT_PREFILL (default 0): the tokens of a prefill the bench
# runs after the decode steps (its kernels then timed or matched too). Usage (repository root, on the
# GPU machine):
#   OUT=$OUT bash tests/ops/gpu_ktime.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
. tests/ops/gpu_env.sh
M=${M:-/tmp/flash4}
if [ ! -f $M/config.json ]; then
    start_flash4 "$OUT"
    wait "$GEN"
fi
[ -x build/cuda/dsinfer ] || build_cuda "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
log "ncu: ${NCU:-none}"
[ -n "$NCU" ] || exit 0
for b in ${KT_BATCH:-1}; do
    if [ -n "${KT_DETAIL:-}" ]; then
        r="$OUT/detail_b$b"
        DSI_CUDA_NOGRAPH=1 timeout ${KT_TIMEOUT:-240} "$NCU" --clock-control none \
            --cache-control "${KT_CACHE:-all}" --kernel-name-base demangled --set full --metrics dram__bytes_read.sum,dram__bytes_write.sum -k "regex:$KT_DETAIL" \
            --launch-skip "${KT_DETAIL_SKIP:-0}" --launch-count "${KT_DETAIL_COUNT:-2}" -f -o "$r" \
            build/cuda/dsinfer bench layer -m $M --ctx 4096 --warmup 1 --steps 1 --batch "$b" \
            --no-split --prefill "${KT_PREFILL:-0}" --prefill-reps 1 --numerics fast >"$r.log" 2>&1
        log "ncu detail batch $b rc $?"
        "$NCU" -i "$r.ncu-rep" --page details --print-units base >"$r.txt" 2>&1
        grep -E "^  [a-z_]+<|Duration|DRAM Throughput|dram__bytes|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Executed Ipc A|L2 Hit Rate|Mem Busy|Max Bandwidth|Theoretical Occ" \
            "$r.txt" | head -60 >>"$OUT/summary.txt"
        if [ "${KT_DETAIL_SRC:-0}" = 1 ]; then # the raw metrics and the source counters too
            "$NCU" -i "$r.ncu-rep" --page raw --csv --print-units base >"$r.raw.csv" 2>&1
            "$NCU" -i "$r.ncu-rep" --page source --csv --print-source sass --print-units base \
                >"$r.src.csv" 2>&1
            python3 tools/ncu_src_sum.py "$r.src.csv" >"$r.src.txt" 2>&1
            log "source page batch $b rc $?"
            gzip -9f "$r.raw.csv" "$r.src.csv"
        fi
        continue
    fi
    f="$OUT/ktime_b$b.csv"
    DSI_CUDA_NOGRAPH=1 timeout ${KT_TIMEOUT:-240} "$NCU" --clock-control none --csv \
        --cache-control "${KT_CACHE:-all}" \
        --print-units base --metrics gpu__time_duration.sum build/cuda/dsinfer bench layer -m $M \
        --ctx 4096 --warmup 1 --steps 1 --batch "$b" --no-split --prefill "${KT_PREFILL:-0}" --prefill-reps 1 --numerics fast \
        >"$f" 2>"$OUT/ktime_b$b.err"
    log "ncu batch $b rc $?: $(grep -c gpu__time_duration "$f") kernels"
    python3 tools/ktime_sum.py "$f" --list >"$OUT/ktime_b$b.txt"
    grep -v "^ *[0-9.]*  (" "$OUT/ktime_b$b.txt" | head -80 >>"$OUT/summary.txt"
done
