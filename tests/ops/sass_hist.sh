#!/bin/bash
# sass_hist.sh - the instruction mix of compiled kernels, to count what a hot loop spends per
# tensor-core instruction (docs/cuda.md, step 22: the MoE walk's loads were ~30% of it). Input:
# an object file (disassembled with cuobjdump, on the GPU machine: this machine has none) or a
# saved `cuobjdump -sass` text (.sass, or .sass.gz; here: sh tools/sass.sh FILE.cu > F.sass). For each function whose mangled name matches
# FUNC_REGEX (grep -E; default: all): its static instruction count, the HMMA / HGMMA count, the
# other instructions per one of them, and the TOP (15) most frequent opcodes (modifiers left out).
# Static counts: both sides of a branch count, a loop body once. Usage:
#   bash tests/ops/sass_hist.sh build/cuda/src/backend/cuda/gvf.o '_Z5k_gvfILi1ELi4ELi1ELb0E'
#   bash tests/ops/sass_hist.sh gvf.sass.gz 'k_gvf' > hist.txt
set -eu
IN=${1:?usage: sass_hist.sh OBJECT|SASS_TEXT [FUNC_REGEX]}
RE=${2:-.}
TOP=${TOP:-15}
[ -f "$IN" ] || { echo "sass_hist.sh: $IN: no such file" >&2; exit 1; }
case "$IN" in
*.sass.gz) dump() { gzip -dc "$IN"; } ;;
*.sass | *.txt) dump() { cat "$IN"; } ;;
*)
    CO=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
    [ -x "$CO" ] || { echo "sass_hist.sh: no cuobjdump here; pass a saved SASS text" >&2; exit 1; }
    dump() { "$CO" -sass "$IN"; }
    ;;
esac
dump | awk -v re="$RE" -v top="$TOP" '
function flush(   n, i, j, k, t, keys, cnt) {
    if (fn == "" || total == 0) return
    mma = ops["HMMA"] + ops["HGMMA"]
    printf "%s: %d instructions, %d HMMA/HGMMA", fn, total, mma
    if (mma > 0) printf ", %.1f others per one", (total - mma) / mma
    printf "\n"
    n = 0
    for (k in ops) { keys[++n] = k; cnt[n] = ops[k] }
    for (i = 1; i <= n; i++) # selection of the largest counts
        for (j = i + 1; j <= n; j++)
            if (cnt[j] > cnt[i]) { t = cnt[i]; cnt[i] = cnt[j]; cnt[j] = t; t = keys[i]; keys[i] = keys[j]; keys[j] = t }
    for (i = 1; i <= n && i <= top; i++) printf "  %8d %s\n", cnt[i], keys[i]
}
/Function : / {
    flush(); delete ops; total = 0
    fn = $0; sub(/.*Function : /, "", fn)
    if (fn !~ re) fn = ""
    next
}
fn != "" && /^ +\/\*[0-9a-f]+\*\/ +[^ ]/ {
    line = $0; sub(/^ +\/\*[0-9a-f]+\*\/ +/, "", line)
    if (line ~ /^@/) sub(/^@!?U?P[0-9T] +/, "", line) # the predicate
    op = line; sub(/[ ;.].*/, "", op)
    ops[op]++; total++
}
END { flush() }'
