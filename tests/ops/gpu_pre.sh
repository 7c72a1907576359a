#!/bin/bash
# gpu_pre.sh - a device run on binaries built on the development machine, so that the device's
# minutes go to measuring instead of compiling (~200 s saved): build/pre/pre.txz (xz: the carry limit) holds stripped
# build/cuda/dsinfer and dsinfer-test (make it with `sh tests/ops/gpu_pre.sh --pack` here, after
# `make BUILD=build/cuda CUDA=1 all`; carry build/pre and build/deps). On the device: the CUDA
# tests (PRE_TESTS, default 'test_cuda_*', space-separated globs run one after another; "none":
# none), while the 4-layer real-shape checkpoint
# is written to /tmp/flash4; then `dsinfer bench layer --numerics fast` at context 4096 (decode at
# PRE_BATCH, default 1, and the 8k prefill) for each variant of PRE_VARIANTS ("base" = the
# defaults, else comma-separated VAR=value settings), alternated PRE_REPS (2) rounds; with
# PRE_PROFILE (variants) a per-op profile (DSI_CUDA_PROFILE=1) for each (PRE_PROF_BATCH: the decode
# batches, comma-separated, default 1; PRE_PROF_PREFILL: the prefill tokens, default 8192, 0 none; PRE_PROF_LEVEL:
# DSI_CUDA_PROFILE's value, default 1, 2: gemm calls by shape too); PRE_MEMCHECK / PRE_RACECHECK:
# compute-sanitizer on those tests (tiny mode, PRE_SAN_TIMEOUT seconds each). Key lines
# in $OUT/summary.txt, the logs packed in $OUT/logs_pre.tgz (KEEP_OUT=1: left as files).
# PRE_LAYERS (default 4): the checkpoint's layers (1: ~70 s to write instead of ~150-200, for a
# quick A/B of the small batches; gpu_env.sh's FLASH_LAYERS); PRE_PREFILL (default 8192; 0: no
# prefill in the bench). PRE_DEADLINE (seconds from the start; 0, the default: none): no step starts with less than
# PRE_STEP_S (30) seconds left, each runs at most until then, and what is skipped is logged, so
# the run packs its results before the device's limit instead of being cut. PRE_CHUNKS (e.g.
# "2560 5120"; none by default): after the benches, prefills of PRE_CHUNK_PREFILL tokens (10240)
# in chunks of each size for each of PRE_CHUNK_VARIANTS (as PRE_VARIANTS; default "base"),
# PRE_REPS rounds. PRE_DETAIL (none by default): Nsight's details with source counters
# (gpu_ktime.sh's KT_DETAIL, KT_DETAIL_SRC=1, the 8k prefill after one batch-1 decode step) on
# each space-separated item REGEX[:SKIP[:COUNT]] (count default 1; REGEX without spaces: '.'
# for one, e.g. 'k_wgr<.int.1,.*224' 'k_attn_fa<:8:2'), into $OUT/detail<i>/, with the settings
# of PRE_DETAIL_ENV (comma-separated VAR=value, as a variant; none by default). The pack's
# dsinfer-old (`--pack OLD`), else PRE_OLD_PACK's (a second pack, e.g. build/pre/old.txz, carried
# too): variants "old" or "old,VAR=value,..." in PRE_VARIANTS / PRE_CHUNK_VARIANTS run it instead,
# for an A/B of changes without a switch in one run. Usage (repository
# root, on the GPU machine):
#   OUT=$OUT PRE_VARIANTS="base DSI_CUDA_WG_Q8=1" PRE_DEADLINE=540 bash tests/ops/gpu_pre.sh
set -u
# --pack [OLD]: build/pre/pre.txz from build/cuda, with OLD (another build's dsinfer, e.g. a
# worktree of an older commit's build/cuda/dsinfer) as dsinfer-old, which the variants named
# "old" run; --pack-old DIR: build/pre/old.txz, DIR/build/cuda/dsinfer alone, for PRE_OLD_PACK.
# xz -9e with a 192 MiB dictionary: the binaries (~54 MB each) share their CUDA code, so all three
# are ~21 MB (step 52) against ~25 MB as two packs, under the device's 64 MiB beside the tracked
# tree (~41 MB). ~2-3 minutes.
if [ "${1:-}" = --pack ] || [ "${1:-}" = --pack-old ]; then
    rm -rf build/pre/x && mkdir -p build/pre/x || exit 1
    if [ "$1" = --pack ]; then
        src=build/cuda files="dsinfer dsinfer-test" dst=build/pre/pre.txz
        if [ -n "${2:-}" ]; then
            strip -o build/pre/x/dsinfer-old "$2" || exit 1
            files="dsinfer dsinfer-old dsinfer-test"
        fi
    else
        src=${2:?usage: gpu_pre.sh --pack-old DIR}/build/cuda files=dsinfer dst=build/pre/old.txz
    fi
    for f in $files; do
        [ "$f" = dsinfer-old ] || strip -o "build/pre/x/$f" "$src/$f" || exit 1
    done
    # shellcheck disable=SC2086 # (the names, split)
    tar cf - -C build/pre/x $files | xz --lzma2=preset=9e,dict=192MiB -T1 >"$dst" &&
        rm -rf build/pre/x && ls -la "$dst"
    exit $?
fi
OUT=${OUT:-/tmp/dsinfer-gpu-out}
mkdir -p "$OUT"
. tests/ops/gpu_env.sh
export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
mkdir -p build/cuda && tar xJf build/pre/pre.txz -C build/cuda || { log "no build/pre/pre.txz"; exit 1; }
log "binaries unpacked"
if [ -n "${PRE_OLD_PACK:-}" ]; then
    mkdir -p build/old && tar xJf "$PRE_OLD_PACK" -C build/old && log "old binaries unpacked"
fi
# bin_of V: the dsinfer of variant V (old: the pack's dsinfer-old, else PRE_OLD_PACK's); envs_of
# V: its settings (into the array envs)
bin_of() {
    case "$1" in
    old | old,*) if [ -x build/cuda/dsinfer-old ]; then echo build/cuda/dsinfer-old; else echo build/old/dsinfer; fi ;;
    *) echo build/cuda/dsinfer ;;
    esac
}
envs_of() {
    envs=()
    local v=${1#old}
    v=${v#,}
    [ -n "$v" ] && [ "$v" != base ] && IFS=, read -ra envs <<<"$v"
    return 0
}
# PRE_DEADLINE: seconds left (a large number without one); lim T: T or what is left if less;
# can WHAT: whether a step may start (else WHAT logged as skipped)
left() {
    local d=${PRE_DEADLINE:-0}
    if [ "$d" -gt 0 ]; then echo $((d - ($(date +%s) - T0))); else echo 1000000; fi
}
lim() {
    local l
    l=$(left)
    if [ "$l" -lt "$1" ]; then echo $((l > 1 ? l : 1)); else echo "$1"; fi
}
can() {
    local l
    l=$(left)
    [ "$l" -ge "${PRE_STEP_S:-30}" ] && return 0
    log "skipped ($l s before the deadline): $*"
    return 1
}
FLASH_LAYERS=${PRE_LAYERS:-4} start_flash4 "$OUT"
if [ "${PRE_TESTS:-test_cuda_*}" != none ]; then
    : >"$OUT/test_cuda.log"
    read -ra tgs <<<"${PRE_TESTS:-test_cuda_*}" # (no glob expansion)
    for tg in "${tgs[@]}"; do
        timeout $(lim ${PRE_TEST_TIMEOUT:-220}) build/cuda/dsinfer-test --root . --only "$tg" \
            >>"$OUT/test_cuda.log" 2>&1
        log "tests $tg rc $?: $(tail -1 "$OUT/test_cuda.log")"
    done
    grep -E "FAIL|fail[^e]" "$OUT/test_cuda.log" | head -20 | tee -a "$OUT/summary.txt"
fi
wait $GEN
log "checkpoint: $(tail -1 "$OUT/gen.log")"
for rep in $(seq 1 "${PRE_REPS:-2}"); do
    for v in ${PRE_VARIANTS:-base}; do
        envs_of "$v"
        f="$OUT/bench_${v//[=,]/_}_$rep.txt"
        can "bench $v rep $rep" || continue
        env "${envs[@]}" timeout $(lim 120) $(bin_of "$v") bench layer -m $M --ctx 4096 --steps 5 \
            --batch "${PRE_BATCH:-1}" --no-split --prefill "${PRE_PREFILL:-8192}" --prefill-reps 1 --numerics fast >"$f" 2>&1
        log "$v rep $rep rc $?"
        grep -E "^ +[0-9]+ |tokens +chunk" "$f" | tee -a "$OUT/summary.txt"
    done
done
# PRE_PROF_BATCH may list batches (comma-separated): one profile each, the prefill with the first
for v in ${PRE_PROFILE:-}; do
    envs=()
    [ "$v" != base ] && IFS=, read -ra envs <<<"$v"
    pf=${PRE_PROF_PREFILL:-8192} pbs=${PRE_PROF_BATCH:-1}
    for pb in ${pbs//,/ }; do
        can "profile $v batch $pb" || continue
        env "${envs[@]}" DSI_CUDA_PROFILE=${PRE_PROF_LEVEL:-1} timeout $(lim 100) build/cuda/dsinfer bench layer -m $M \
            --ctx 4096 --steps 2 --batch "$pb" --no-split --prefill "$pf" --prefill-reps 1 --numerics fast \
            >"$OUT/profile_${v//[=,]/_}_b$pb.txt" 2>&1
        log "profile $v batch $pb rc $?"
        pf=0
    done
done
# the Nsight details (PRE_DETAIL), each in a folder of its own
i=0
for d in ${PRE_DETAIL:-}; do
    i=$((i + 1))
    IFS=: read -r dre dskip dcount <<<"$d"
    can "detail $dre" || continue
    mkdir -p "$OUT/detail$i"
    denvs=()
    [ -n "${PRE_DETAIL_ENV:-}" ] && IFS=, read -ra denvs <<<"$PRE_DETAIL_ENV"
    env "${denvs[@]}" OUT=$OUT/detail$i M=$M KT_BATCH=1 KT_PREFILL=8192 KT_DETAIL="$dre" KT_DETAIL_SKIP=${dskip:-0} \
        KT_DETAIL_COUNT=${dcount:-1} KT_DETAIL_SRC=1 KT_TIMEOUT=$(lim 240) bash tests/ops/gpu_ktime.sh
    log "detail $i ($dre) done"
    grep -v "^==" "$OUT/detail$i/summary.txt" >>"$OUT/summary.txt"
done
# the chunked prefills (PRE_CHUNKS)
for rep in $(seq 1 "${PRE_REPS:-2}"); do
    for ch in ${PRE_CHUNKS:-}; do
        for v in ${PRE_CHUNK_VARIANTS:-base}; do
            envs_of "$v"
            can "chunks $ch $v rep $rep" || continue
            f="$OUT/chunk${ch}_${v//[=,]/_}_$rep.txt"
            env "${envs[@]}" timeout $(lim 90) $(bin_of "$v") bench layer -m $M --ctx 4096 --steps 1 \
                --warmup 1 --batch 1 --no-split --prefill "${PRE_CHUNK_PREFILL:-10240}" --prefill-chunk "$ch" \
                --prefill-reps 1 --numerics fast >"$f" 2>&1
            log "chunks $ch $v rep $rep rc $?"
            grep -E "^ *${PRE_CHUNK_PREFILL:-10240} " "$f" | tee -a "$OUT/summary.txt"
        done
    done
done
# the sanitizers (tiny mode) on the tests matching PRE_MEMCHECK / PRE_RACECHECK (patterns of
# dsinfer-test --only; none by default), each run within PRE_SAN_TIMEOUT seconds (120)
if [ -n "${PRE_MEMCHECK:-}" ] && can "memcheck"; then
    DSI_TEST_TINY=1 timeout $(lim ${PRE_SAN_TIMEOUT:-120}) compute-sanitizer --tool memcheck --print-limit 20 \
        build/cuda/dsinfer-test --root . --only "$PRE_MEMCHECK" >"$OUT/memcheck.log" 2>&1
    log "memcheck rc $?: $(grep -E 'ERROR SUMMARY|passed' "$OUT/memcheck.log" | tr '\n' ' ')"
fi
if [ -n "${PRE_RACECHECK:-}" ] && can "racecheck"; then
    DSI_TEST_TINY=1 timeout $(lim ${PRE_SAN_TIMEOUT:-120}) compute-sanitizer --tool racecheck --print-limit 10 \
        build/cuda/dsinfer-test --root . --only "$PRE_RACECHECK" >"$OUT/racecheck.log" 2>&1
    log "racecheck rc $?: $(grep -E 'RACECHECK SUMMARY|passed' "$OUT/racecheck.log" | tr '\n' ' ')"
fi
log "done"
[ "${KEEP_OUT:-0}" = 1 ] || pack_out logs_pre # (KEEP_OUT=1: the files left as they are)
