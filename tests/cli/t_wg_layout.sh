#!/bin/sh
# The prefill wgmma kernels' index and bit arithmetic (wgr.cu's copies, k_wg_bf16_q8's pairs,
# wgq.cu's copies, K order, FP4 -> e4m3 table, fragments and promotion), emulated on the CPU by
# tools/wg_layout_check.py against the reference sums: runs without a GPU, so CI checks the
# layout of kernels it cannot run. Skips (exit 0) without python3 + numpy.
set -u
if ! python3 -c 'import numpy' 2>/dev/null; then
    echo "skipped: no python3 with numpy"
    exit 0
fi
python3 tools/wg_layout_check.py
