#!/bin/sh
# sass.sh - the machine code (SASS) of CUDA sources on a machine without a GPU: each FILE.cu
# compiled to a cubin with the build's flags (nvcc -cubin, sm_90a, --fmad=false) and disassembled
# by nvdisasm: $NVDISASM, else nvdisasm on PATH, else build/nvdisasm/ (PyPI's
# nvidia-cuda-nvdisasm wheel, fetched once with pip download: the toolkit here has no nvdisasm or
# cuobjdump). Each kernel starts with a "Function : NAME" line, as in cuobjdump -sass, so
# tests/ops/sass_hist.sh reads the output. Step 25 read wg.cu's join of wgmma branches and
# k_hc_mix's shared-memory cycles this way (docs/cuda.md). Usage (repository root):
#   sh tools/sass.sh src/backend/cuda/wg.cu > /tmp/wg.sass
#   bash tests/ops/sass_hist.sh /tmp/wg.sass 'k_wg'
set -eu
case "${1:-}" in
"" | -h | --help)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac
command -v nvcc >/dev/null || { echo "sass.sh: nvcc not found" >&2; exit 1; }
ND=${NVDISASM:-$(command -v nvdisasm || true)}
if [ -z "$ND" ]; then
    ND=$(find build/nvdisasm -name nvdisasm -type f 2>/dev/null | head -1)
    if [ -z "$ND" ]; then
        mkdir -p build/nvdisasm
        pip download --no-deps -q -d build/nvdisasm nvidia-cuda-nvdisasm >&2 ||
            { echo "sass.sh: no nvdisasm, and pip download nvidia-cuda-nvdisasm failed" >&2; exit 1; }
        python3 -m zipfile -e build/nvdisasm/nvidia_cuda_nvdisasm-*.whl build/nvdisasm/x >&2
        ND=$(find build/nvdisasm -name nvdisasm -type f | head -1)
        [ -n "$ND" ] || { echo "sass.sh: the wheel holds no nvdisasm" >&2; exit 1; }
        chmod +x "$ND"
    fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "$@"; do
    [ -f "$f" ] || { echo "sass.sh: $f: no such file" >&2; exit 1; }
    b=$(basename "$f" .cu)
    nvcc -O3 -std=c++17 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a --fmad=false \
        -cubin -o "$tmp/$b.cubin" "$f" || { echo "sass.sh: $f: nvcc failed" >&2; exit 1; }
    "$ND" -c "$tmp/$b.cubin" |
        sed -E 's@^//-+ \.text\.([A-Za-z0-9_$]+) -+$@        Function : \1@'
done
