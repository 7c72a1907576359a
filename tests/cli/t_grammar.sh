#!/bin/sh
# Structured outputs (src/grammar) through `dsinfer grammar` on the tiny model's tokenizer:
# compile/print/sample/masks for EBNF, regex, JSON Schema and json_object; bad input gives one
# error line naming the position or keyword, exit 1 (2 for usage), no crash; pathological
# regexes are refused quickly. (Real-vocabulary suites: t_grammar_suite.sh, t_grammar_xgr.sh.)
set -u
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
if ! $DSINFER grammar --help >/dev/null 2>&1; then
    if $DSINFER grammar --help 2>&1 | grep -q "unknown command"; then
        echo "SKIP: build/dsinfer has no 'grammar' command yet (tools/dsinfer.c dispatch: cmd_grammar)"
        exit 0
    fi
    fail "grammar --help"
fi
G=tests/golden/grammar

# expect_error WANT CMD... : exit 1 or 2 (not a signal), stderr mentions WANT
expect_error() {
    want=$1
    shift
    "$@" >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "'$*' exited $rc"
    grep -q -- "$want" "$T/err" || fail "'$*': error '$(cat "$T/err")' lacks '$want'"
}

for f in $G/ebnf/*.ebnf; do
    $DSINFER grammar check --ebnf "$f" >"$T/c" || fail "check $f"
    grep -q "rules .* states .* mask sets" "$T/c" || fail "check $f: no statistics"
    $DSINFER grammar print --ebnf "$f" >"$T/p.ebnf" || fail "print $f"
    $DSINFER grammar print --ebnf "$T/p.ebnf" >"$T/p2.ebnf" || fail "reparse printed $f"
    cmp -s "$T/p.ebnf" "$T/p2.ebnf" || fail "print is not a fixed point for $f"
done
n=0
for f in $G/schemas/*.json; do
    $DSINFER grammar check --schema "$f" >/dev/null || fail "check $f"
    n=$((n + 1))
done
[ $n -ge 50 ] || fail "only $n schemas"

# sampling: outputs are valid JSON objects; same seed -> same output
$DSINFER grammar sample --json-object --seed 3 --count 5 >"$T/s1" || fail "sample json_object"
$DSINFER grammar sample --json-object --seed 3 --count 5 >"$T/s2" || fail "sample json_object again"
cmp -s "$T/s1" "$T/s2" || fail "sampling is not reproducible"
[ "$(wc -l <"$T/s1")" -eq 5 ] || fail "sample --count 5 printed $(wc -l <"$T/s1") lines"
if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    assert isinstance(json.loads(json.loads(line)), dict)
' "$T/s1" || fail "json_object output is not a JSON object"
    $DSINFER grammar sample --schema $G/schemas/tool_weather.json --ws compact --seed 1 --count 5 >"$T/w" || fail "sample schema"
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    v = json.loads(json.loads(line))
    assert set(v) <= {"location", "unit"} and "location" in v, v
    assert v.get("unit", "celsius") in ("celsius", "fahrenheit"), v
' "$T/w" || fail "tool_weather output does not validate"
fi
out=$($DSINFER grammar sample --regex '(ab|cd){2,3}x' --seed 7) || fail "sample regex"
echo "$out" | grep -Eq '^"((ab|cd)){2,3}x"$' || fail "regex output '$out'"

# masks along a token sequence: n + 1 masks of (V+31)/32 words
ids=$(printf '{"a": [1, 2]}' | $DSINFER tokenize -m models/dsv4-tiny 2>/dev/null | tr ' ' ',')
if [ -n "$ids" ]; then
    $DSINFER grammar masks --json-object --ids "$ids" --out "$T/m.bin" || fail "masks"
    nid=$(echo "$ids" | tr ',' '\n' | wc -l)
    [ -s "$T/m.bin" ] || fail "masks: empty file"
    expect_error "not allowed" $DSINFER grammar masks --regex 'x+' --ids "$ids" --out "$T/m2.bin"
    : "$nid"
fi

# bad input: one line naming the position / keyword
printf 'root ::= "a" b\n' >"$T/bad1.ebnf"
expect_error "rule 'b' is used but not defined" $DSINFER grammar check --ebnf "$T/bad1.ebnf"
printf 'root ::= ("a"\n' >"$T/bad2.ebnf"
expect_error "ebnf:1:10: missing ')'" $DSINFER grammar check --ebnf "$T/bad2.ebnf"
printf '{"type": "object", "properties": {"x": {"not": {"type": "string"}}}}' >"$T/bad1.json"
expect_error "unsupported keyword 'not' at #/properties/x" $DSINFER grammar check --schema "$T/bad1.json"
printf '{"type": "string", "format": "ipv6"}' >"$T/bad2.json"
expect_error "unsupported format 'ipv6'" $DSINFER grammar check --schema "$T/bad2.json"
printf '{"type": ' >"$T/bad3.json"
expect_error "not JSON" $DSINFER grammar check --schema "$T/bad3.json"
expect_error "backreference unsupported" $DSINFER grammar check --regex '(a)\1'
expect_error "lookaround" $DSINFER grammar check --regex 'a(?!b)'
expect_error "no such file\|cannot\|No such" $DSINFER grammar check --schema /nonexistent.json
expect_error "unknown command" $DSINFER grammar frob
expect_error "unknown or incomplete option" $DSINFER grammar check --json-object --bogus
expect_error "--ws" $DSINFER grammar check --json-object --ws tight
# pathological regexes: refused fast with an error, never a blow-up
s=$(date +%s)
expect_error "grammar too complex" $DSINFER grammar check --regex '(a|b)*a(a|b){30}'
expect_error "grammar too complex" $DSINFER grammar check --regex '(((x{50}){50}){50}){50}'
expect_error "above the limit" $DSINFER grammar check --regex 'a{1000000}'
e=$(date +%s)
[ $((e - s)) -le 20 ] || fail "pathological regexes took $((e - s)) s"
echo ok
