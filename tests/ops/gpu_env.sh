# shellcheck shell=bash
# gpu_env.sh - sourced by the device-run scripts (gpu_ab_env.sh, gpu_final.sh): log() into
# $OUT/summary.txt with the seconds since start, the GPU and driver line, and the jansson/pcre2
# build flags from build/deps (carried from the development machine) where the machine lacks
# their dev files. Needs OUT set.
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "== [$(($(date +%s) - T0))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
if [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/include/pcre2.h ]; then
    export CFLAGS="-O2 -g -I$PWD/build/deps/include" LDFLAGS="-L$PWD/build/deps/lib"
    export LD_LIBRARY_PATH=$PWD/build/deps/lib:${LD_LIBRARY_PATH:-}
fi
# start_flash4 LOGDIR: write the 4-layer V4-Flash-shaped random checkpoint to $M (/tmp/flash4) in
# the background (GEN: its pid; LOGDIR/gen.log ends with "gen exit <rc>"); KEEP_CKPT=1: one
# already there (written by an earlier script of the same command) is kept. FLASH_LAYERS=N
# (default 4): N layers instead, at /tmp/flash_lN (1: layer 0 alone, window attention and the
# hash MoE, written in ~70 s against ~150-200 s: a quick A/B of the small batches, step 38).
start_flash4() {
    local nl=${FLASH_LAYERS:-4}
    M=/tmp/flash4
    [ "$nl" != 4 ] && M=/tmp/flash_l$nl
    if [ "${KEEP_CKPT:-0}" = 1 ] && [ -f $M/config.json ]; then
        echo "gen exit 0 (kept)" >"$1/gen.log"
        (exit 0) &
        GEN=$!
        return
    fi
    (python3 ref/make_checkpoint.py --preset flash --layers "$nl" --no-verify --out $M >"$1/gen.log" 2>&1
     echo "gen exit $?" >>"$1/gen.log") &
    # shellcheck disable=SC2034 # GEN and M are the sourcing script's
    GEN=$!
}
# build_cuda LOGDIR: build/cuda's dsinfer-test and dsinfer, or the build log's tail and exit 1.
build_cuda() {
    make -j"$(nproc)" BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/dsinfer >"$1/build.log" 2>&1 ||
        { tail -30 "$1/build.log"; log "BUILD FAILED"; exit 1; }
}
# pack_out NAME: every file under $OUT but summary.txt and earlier *.tgz into $OUT/NAME.tgz, the
# originals removed (the device tool brings back at most 8 files a call, named in letters,
# digits, '.', '_', '-').
pack_out() {
    (cd "$OUT" && find . -type f ! -name summary.txt ! -name '*.tgz' | sed 's|^\./||' >/tmp/pack.list &&
        [ -s /tmp/pack.list ] && tar czf "$1.tgz" -T /tmp/pack.list && xargs rm -f </tmp/pack.list)
    return 0
}
