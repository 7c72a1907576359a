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
