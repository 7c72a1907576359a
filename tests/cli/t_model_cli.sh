#!/bin/sh
# CLI checks on the tiny golden checkpoint: inspect, logits (chunked == whole), generate,
# and bad input (malformed/unsupported config, missing dir, out-of-range ids, bad options):
# one error line naming the file/field, non-zero exit, no crash (exit code < 128).
set -u
M=tests/golden/tiny-a/model
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect_error CMD... : must exit 1 or 2 (not a signal) and print exactly one line on stderr
expect_error() {
    want=$1
    shift
    "$@" >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "'$*' exited $rc"
    [ "$(wc -l <"$T/err")" -ge 1 ] || fail "'$*' printed no error"
    grep -q -- "$want" "$T/err" || fail "'$*': error '$(cat "$T/err")' lacks '$want'"
}

$DSINFER --help >/dev/null || fail "--help"
for c in generate logits inspect bench; do $DSINFER $c --help >/dev/null || fail "$c --help"; done
$DSINFER inspect -m $M >"$T/inspect" || fail "inspect"
grep -q "validation: ok" "$T/inspect" || fail "inspect: no validation line"
grep -q "F8_E4M3" "$T/inspect" || fail "inspect: no dtype table"
# the cache's bytes a position (tiny-a: CSA ratio 4 twice, HCA ratio 8; head_dim 128, rope 64,
# index_head_dim 128): f32 2 x (512 + 512) / 4 + 512 / 8 = 576; fp8 rows 64 + 128 + 8 = 200 and
# FP4 keys 64 + 4 = 68: 2 x 268 / 4 + 200 / 8 = 159
grep -q "f32 *576.0 bytes a position" "$T/inspect" || fail "inspect: f32 cache bytes"
grep -q "fp8 *159.0 bytes a position" "$T/inspect" || fail "inspect: fp8 cache bytes"

P=5,17,300,42,8,999,3,77,128,64,11,12,13,14,15,16,17,18,19,20,21,22,23
$DSINFER logits -m $M --prompt-ids $P --out "$T/a.f32" || fail "logits"
$DSINFER logits -m $M --prompt-ids $P --out "$T/b.f32" --chunk 1 || fail "logits --chunk 1"
cmp -s "$T/a.f32" "$T/b.f32" || fail "chunked logits differ"
[ "$(wc -c <"$T/a.f32")" -eq $((23 * 1024 * 4)) ] || fail "logits file size"
$DSINFER logits -m $M --prompt-ids $P --out "$T/r.f32" --numerics reference || fail "reference"
cmp -s "$T/a.f32" "$T/r.f32" && fail "reference numerics equal plain"
# the FP8 cache (the default with reference numerics) and the f32 cache: the same bytes
$DSINFER logits -m $M --prompt-ids $P --out "$T/r8.f32" --numerics reference --kv-cache f32 --chunk 3 ||
    fail "reference --kv-cache f32"
cmp -s "$T/r.f32" "$T/r8.f32" || fail "reference logits differ between the fp8 and the f32 cache"
expect_error "kv cache fp8" $DSINFER logits -m $M --prompt-ids $P --out "$T/x" --kv-cache fp8
expect_error "want auto, f32 or fp8" $DSINFER logits -m $M --prompt-ids $P --out "$T/x" --kv-cache fp16

out=$($DSINFER generate -m $M --prompt-ids 5,6,7 -n 8 --temperature 0) || fail "generate"
[ "$(echo "$out" | wc -w)" -ge 1 ] || fail "generate printed no ids"
g1=$($DSINFER generate -m $M --prompt-ids 5,6,7 -n 8 --seed 3 --temperature 1)
g2=$($DSINFER generate -m $M --prompt-ids 5,6,7 -n 8 --seed 3 --temperature 1 --threads 1)
[ "$g1" = "$g2" ] || fail "seeded generation not reproducible: '$g1' vs '$g2'"

expect_error "out of range" $DSINFER logits -m $M --prompt-ids 5,1024 --out "$T/x"
expect_error "out of range" $DSINFER generate -m $M --prompt-ids 5,99999
expect_error "prompt-ids" $DSINFER generate -m $M --prompt-ids 5,abc
expect_error "temperature" $DSINFER generate -m $M --prompt-ids 5 --temperature x
expect_error "unknown" $DSINFER generate -m $M --bogus
expect_error "unknown command" $DSINFER frobnicate
expect_error "/nonexistent" $DSINFER inspect -m /nonexistent

cp -r $M "$T/m1"
echo '{"model_type": "deepseek_v4", "vocab_size": ' >"$T/m1/config.json"
expect_error "config.json: malformed JSON" $DSINFER inspect -m "$T/m1"
sed -i 's/.*/{"model_type": "llama"}/' "$T/m1/config.json"
expect_error "model_type \"llama\" is not supported" $DSINFER generate -m "$T/m1" --prompt-ids 1
cp -r $M "$T/m2"
f=$(ls "$T/m2"/model-*.safetensors | head -1)
head -c 20000 "$f" >"$T/trunc" && mv "$T/trunc" "$f"
expect_error "truncated" $DSINFER inspect -m "$T/m2"

# bench layer --leave-out: a line per left-out op; an unknown op named in one error line
$DSINFER bench layer -m $M --backend cpu --batch 1 --ctx 32 --steps 1 --warmup 0 --prefill 0 \
    --no-split --leave-out rope,moe >"$T/bench" || fail "bench layer --leave-out"
grep -q "batch 1 without rope " "$T/bench" || fail "bench layer: no line without rope"
grep -q "batch 1 without moe " "$T/bench" || fail "bench layer: no line without moe"
grep -q "batch > 1" "$T/bench" && fail "bench layer: the batch > 1 note at batch 1"
# at batch 2 the note on routing; moe_route's line says it is not its cost
$DSINFER bench layer -m $M --backend cpu --batch 2 --ctx 32 --steps 1 --warmup 0 --prefill 0 \
    --no-split --leave-out moe_route >"$T/bench2" || fail "bench layer --leave-out, batch 2"
grep -q "batch 2 without moe_route .*not its cost" "$T/bench2" || fail "bench layer: moe_route line"
grep -q "batch > 1: without an op" "$T/bench2" || fail "bench layer: no routing note at batch 2"
expect_error "no op 'frob'" $DSINFER bench layer -m $M --backend cpu --leave-out rope,frob
echo ok
