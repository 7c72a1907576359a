#!/bin/bash
# gpu_ab_trees.sh - one device run comparing versions of the sources (e.g. commits not yet
# merged). Each variant is a folder build/variants/<name>/ (carry build/variants with build/deps)
# holding either a whole src/backend/cuda (its files at the top) or trees of the repository
# (src, include, tests, ...: tests/ops/fill_variants.sh NAME=GITREF ... writes those). The tree
# itself is built once (build/cuda); each variant is a copy of it with the variant's files in
# place of the tree's (the folders it holds replace the tree's), rebuilt (only the files that
# differ recompile). Then the CUDA tests on the variants named in
# AB_TEST_TREES (default: all; none: no tests; a failing one makes the run also test the others,
# unless AB_RETEST=0), and
# `dsinfer bench layer` at context 4096 (decode at AB_BATCH, `fast` numerics, AB_PREFILL) for each
# variant, alternated, AB_REPS rounds; AB_PROFILE=1 adds a per-op profile per variant (a decode
# step at batch AB_PROFILE_BATCH, default 1 (a list such as 1,256 profiles each), and a prefill of
# AB_PROFILE_PREFILL tokens, default 0) for the words in AB_PROFILE_TREES (default: all words).
# A word of AB_TREES may be tree:VAR=value,VAR=value (that tree benched with those settings).
# Key lines in $OUT/summary.txt, logs in $OUT/logs.tgz. Usage (repository root, GPU machine):
#   OUT=$OUT AB_TREES="main gvf-nodiv" bash tests/ops/gpu_ab_trees.sh
set -u
OUT=${OUT:-/tmp/dsinfer-gpu-out}
L=/tmp/ab-logs
rm -rf $L && mkdir -p "$OUT" $L
. tests/ops/gpu_env.sh
WORDS=${AB_TREES:-$(ls build/variants)}
TREES=$(for w in $WORDS; do echo "${w%%:*}"; done | awk '!s[$0]++' | tr '\n' ' ')
# word_env WORD: the settings of a tree:VAR=value,... word, one per line
word_env() { [[ $1 == *:* ]] && tr , '\n' <<<"${1#*:}"; }
BATCH=${AB_BATCH:-1,2,8,32,256}
PREFILL=${AB_PREFILL:-0}
# overlay VARIANT DIR: VARIANT's files that differ from DIR's are copied there and touched (so
# that make rebuilds them and what includes them); in src and include (built by wildcards) the
# files VARIANT lacks go too
overlay() {
    local f top
    for top in "$1"/*; do
        top=$(basename "$top")
        [ "$top" = src ] || [ "$top" = include ] &&
            (cd "$2" && find "$top" -type f 2>/dev/null) | while read -r f; do
                [ -f "$1/$f" ] || rm -f "${2:?}/$f"
            done
        (cd "$1" && find "$top" -type f) | while read -r f; do
            cmp -s "$1/$f" "$2/$f" && continue
            mkdir -p "$(dirname "$2/$f")" && cp "$1/$f" "$2/$f" && touch "$2/$f"
        done
    done
}
start_flash4 $L
J=$(nproc)
PIDS=()
build_cuda $L
log "tree built"
for v in $TREES; do
    d=/tmp/v_$v
    rm -rf "$d" && mkdir -p "$d"
    cp -a Makefile include src tools tests ref build "$d"/ 2>/dev/null
    if [ -d build/variants/$v/src ]; then
        overlay build/variants/$v "$d"
    else
        rm -f "$d"/src/backend/cuda/* && cp build/variants/$v/* "$d"/src/backend/cuda/ && touch "$d"/src/backend/cuda/*
    fi
    (cd "$d" && make -j"$J" BUILD=build/cuda CUDA=1 build/cuda/dsinfer-test build/cuda/dsinfer \
        >"$L/build_$v.log" 2>&1; echo $? >"$L/build_$v.rc") &
    PIDS+=($!)
done
wait "${PIDS[@]}"
for v in $TREES; do log "variant $v build rc $(cat $L/build_$v.rc)"; done
test_tree() { # name
    (cd /tmp/v_$1 && timeout 200 build/cuda/dsinfer-test --root . --only 'test_cuda_*') >"$L/test_$1.log" 2>&1
    local rc=$?
    log "test_cuda $1 rc $rc: $(tail -1 "$L/test_$1.log")"
    grep -E "FAIL|fail[^e]" "$L/test_$1.log" | head -10 | tee -a "$OUT/summary.txt"
    return $rc
}
FAILED=0
[ "${AB_TEST_TREES:-}" = none ] && AB_TEST_TREES= TREES_T= || TREES_T=${AB_TEST_TREES:-$TREES}
for v in $TREES_T; do test_tree $v || FAILED=1; done
if [ $FAILED = 1 ] && [ -n "${AB_TEST_TREES:-}" ] && [ "${AB_RETEST:-1}" != 0 ]; then
    for v in $TREES; do [[ " $AB_TEST_TREES " == *" $v "* ]] || test_tree $v; done
fi
wait $GEN
log "checkpoint: $(tail -1 "$L/gen.log")"
for rep in $(seq 1 "${AB_REPS:-2}"); do
    for w in $WORDS; do
        v=${w%%:*}
        f="$L/bench_${w//[:=,]/_}_$rep.txt"
        mapfile -t envs < <(word_env "$w")
        env "${envs[@]}" timeout 120 /tmp/v_$v/build/cuda/dsinfer bench layer -m $M --ctx 4096 --steps 7 --batch "$BATCH" \
            --no-split --prefill "$PREFILL" --prefill-reps 1 --numerics fast >"$f" 2>&1
        log "bench $w rep $rep rc $?"
        grep -E "^ +[0-9]+ |tokens +chunk" "$f" | tee -a "$OUT/summary.txt"
    done
done
if [ -n "${AB_PROFILE:-}" ]; then
    for w in ${AB_PROFILE_TREES:-$WORDS}; do
        v=${w%%:*}
        mapfile -t envs < <(word_env "$w")
        env "${envs[@]}" DSI_CUDA_PROFILE=1 timeout 100 /tmp/v_$v/build/cuda/dsinfer bench layer -m $M \
            --ctx 4096 --steps 5 --batch "${AB_PROFILE_BATCH:-1}" --no-split \
            --prefill "${AB_PROFILE_PREFILL:-0}" --prefill-reps 1 --numerics fast \
            >"$L/profile_${w//[:=,]/_}.txt" 2>&1
        log "profile $w rc $?"
    done
fi
tar czf "$OUT/logs.tgz" -C $L .
log "done"
