#!/bin/sh
# ksize.sh - the machine-code size of every CUDA kernel, largest first: each .cu compiled to a
# cubin with the build's flags (nvcc -cubin, sm_90a, --fmad=false), the size of each kernel's
# .text section (readelf). At decode a single-block kernel waits for its instructions on its first
# run through them, so size costs time (docs/cuda.md step 18: gvf.cu's 119 KB instances). No GPU
# needed. Usage (repository root): sh tools/ksize.sh [-n N] [FILE.cu ...]
#   -n N   the N largest (default 30); FILEs: default every src/backend/cuda/*.cu
set -eu
n=30
case "${1:-}" in
-h | --help)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
-n)
    n=$2
    shift 2
    ;;
esac
[ $# -gt 0 ] || set -- src/backend/cuda/*.cu
command -v nvcc >/dev/null || { echo "ksize.sh: nvcc not found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$@"; do
    [ -f "$f" ] || { echo "ksize.sh: $f: no such file" >&2; exit 1; }
    b=$(basename "$f" .cu)
    nvcc -O3 -std=c++17 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a --fmad=false \
        -cubin -o "$tmp/$b.cubin" "$f" || { echo "ksize.sh: $f: nvcc failed" >&2; exit 1; }
    readelf -SW "$tmp/$b.cubin" 2>/dev/null | awk -v f="$b" '
        { for (i = 1; i <= NF; i++) if ($i ~ /^\.text\./ && $(i + 1) == "PROGBITS") {
              name = substr($i, 7); size = $(i + 4)
              printf "%s %s %s\n", size, f, name } }'
done | while read -r hex file name; do
    printf '%8d  %-10s %s\n' "$((0x$hex))" "$file" "$(echo "$name" | c++filt 2>/dev/null || echo "$name")"
done | sort -rn | head -n "$n" | awk '{ printf "%7.1f KB  %s\n", $1 / 1024, substr($0, index($0, $2)) }'
