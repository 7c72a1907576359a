#!/bin/sh
# Structured outputs through the serving engine: `dsinfer run` with response_format on a
# random-weight model (ref/make_checkpoint.py --preset tiny-a --layers 1, written here; the tiny
# golden checkpoint without numpy) with the tokenizer of models/dsv4-tiny, sampled at
# temperature 1 with many seeds; every complete output checked by an outside parser
# (ref/grammar_run_check.py: Python jsonschema for the schema corpus tests/golden/grammar/schemas
# in both whitespace policies, re.fullmatch for the regex suite, json / ast / SQLite for the EBNF
# suite), at least 50 schemas validated, few outputs cut by max_tokens. Then the trained default
# model with its whole vocabulary (special ids never sampled), bad response_formats as per-request
# error lines that disturb nothing, and the same outputs with asynchronous scheduling off.
# SKIP_SLOW=1 (the ASan run): one seed per case, compact JSON only. Needs python3 with
# jsonschema; skipped without it, except under CI (CI=true), where it fails.
set -u
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
TOK=models/dsv4-tiny
G=tests/golden/grammar
if ! $DSINFER run --help 2>/dev/null | grep -q response_format; then
    echo "SKIP: 'dsinfer run' has no response_format"
    exit 0
fi
[ -f $TOK/tokenizer.json ] || { echo "SKIP: no $TOK/tokenizer.json"; exit 0; }
if ! python3 -c "import jsonschema" 2>/dev/null; then
    if [ "${CI:-}" = true ]; then fail "python3 module 'jsonschema' missing (pip install jsonschema)"; fi
    echo "SKIP: python3 module 'jsonschema' missing"
    exit 0
fi
M="$T/model"
if ! python3 ref/make_checkpoint.py --preset tiny-a --layers 1 --seed 3 --no-verify --out "$M" \
    >"$T/mk.log" 2>&1; then
    if [ "${CI:-}" = true ]; then fail "make_checkpoint: $(tail -3 "$T/mk.log")"; fi
    echo "note: no numpy, using tests/golden/tiny-a/model (slower)"
    M=tests/golden/tiny-a/model
fi

# 1. the suites on the random model
if [ "${SKIP_SLOW:-0}" = 1 ]; then
    set -- --seeds 1 --max-tokens 256 --min-schemas 25 schemas:$G/schemas:compact json_object:compact
else
    set -- --seeds 4 --max-tokens 384 --min-schemas 50 schemas:$G/schemas schemas:$G/schemas:compact \
        json_object json_object:compact
fi
python3 ref/grammar_run_check.py --dsinfer "$DSINFER" -m "$M" --tokenizer $TOK --ws-limit 2 \
    --special 0-2 --max-length-share 0.4 "$@" regexes:$G/regexes.txt \
    ebnf-json:$G/ebnf/json.ebnf ebnf-json:$G/ebnf/xgr_builtin_json.ebnf \
    ebnf-arith:$G/ebnf/arith.ebnf ebnf-sql:$G/ebnf/sql.ebnf || fail "random model: invalid outputs"

# 2. the trained model with its whole vocabulary: added tokens (8000..) never sampled
if [ "${SKIP_SLOW:-0}" != 1 ]; then
    python3 ref/grammar_run_check.py --dsinfer "$DSINFER" -m $TOK --seeds 2 --max-tokens 128 \
        --special 0-2,8000-8191 --max-length-share 0.5 \
        'regex:\d{3}-\d{4}' 'regex:(\d{1,3}\.){3}\d{1,3}' 'regex:[αβγδ]+[一-龥]{1,3}' \
        'regex:.{3,10}' 'regex:(red|green|blue)(, (red|green|blue)){0,4}' \
        schema:$G/schemas/tool_weather.json:compact schema:$G/schemas/classification.json \
        || fail "trained model: invalid outputs"
fi

# 3. bad response_formats: one error line each, naming the problem; the others complete
cat >"$T/in.jsonl" <<'JSONL'
{"id": "ok1", "prompt": [5, 17, 300], "max_tokens": 64, "temperature": 1, "seed": 2, "response_format": {"type": "regex", "regex": "(yes|no)-[0-9]{2}"}}
{"id": "b1", "prompt": [5, 17, 300], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}}}
{"id": "b2", "prompt": [5, 17, 300], "response_format": {"type": "regex", "regex": "(a)\\1"}}
{"id": "b3", "prompt": [5, 17, 300], "response_format": {"type": "yaml"}}
{"id": "b4", "prompt": [5, 17, 300], "response_format": {"type": "grammar", "grammar": "root ::= item\n"}}
{"id": "b5", "prompt": [5, 17, 300], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}
{"id": "b6", "prompt": [5, 17, 300], "response_format": "json"}
{"id": "b7", "prompt": [5, 17, 300], "response_format": {"type": "json_object", "schema": {}}}
{"id": "b8", "prompt": [5, 17, 300], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "minimum": 0}}}}
{"id": "ok2", "prompt": [5, 17, 300], "max_tokens": 64, "temperature": 0, "n": 2, "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["ok", "n"]}}, "whitespace": "compact"}}
{"id": "ok3", "prompt": [5, 17, 300], "max_tokens": 8, "temperature": 1, "seed": 3, "response_format": {"type": "text"}}
JSONL
$DSINFER run -m "$M" --tokenizer $TOK --input "$T/in.jsonl" --output "$T/out.jsonl" --no-progress \
    2>"$T/err" || fail "run exited $?: $(cat "$T/err")"
grep -q "11 requests (8 errors)" "$T/err" || fail "summary: $(tail -1 "$T/err")"
line() { sed -n "$1p" "$T/out.jsonl"; }
line 1 | grep -q '"id":"ok1",.*"text":"\(yes\|no\)-[0-9][0-9]",.*"finish_reason":"stop","stop_reason":null' ||
    fail "ok1: $(line 1)"
line 2 | grep -q '"id":"b1","error":{"code":"unsupported","message":"response_format: json schema: unsupported keyword .not. at #"' || fail "b1: $(line 2)"
line 3 | grep -q '"id":"b2","error":{"code":"unsupported","message":"response_format: regex: backreference' || fail "b2: $(line 3)"
line 4 | grep -q '"id":"b3","error":{"code":"invalid_request","message":"response_format: unknown type \\"yaml\\"' || fail "b3: $(line 4)"
line 5 | grep -q '"id":"b4","error":{"code":"invalid_request","message":"response_format: ebnf:.*item' || fail "b4: $(line 5)"
line 6 | grep -q '"id":"b5","error":{.*no \\"schema\\"' || fail "b5: $(line 6)"
line 7 | grep -q '"id":"b6","error":{.*field \\"response_format\\": want an object' || fail "b6: $(line 7)"
line 8 | grep -q '"id":"b7","error":{.*unknown field \\"schema\\"' || fail "b7: $(line 8)"
line 9 | grep -q '"id":"b8","error":{"code":"unsupported",.*minimum' || fail "b8: $(line 9)"
line 10 | grep -q '"id":"ok2",.*"index":1,' || fail "ok2: $(line 10)"
python3 - "$T/out.jsonl" <<'PY' || fail "ok2 outputs"
import json, sys
r = [json.loads(x) for x in open(sys.argv[1])][9]
for c in r["choices"]:
    assert c["finish_reason"] == "stop" and c["stop_reason"] is None, c
    v = json.loads(c["text"])
    assert list(v) == ["ok", "n"] and isinstance(v["ok"], bool) and 1 <= v["n"] <= 9, c["text"]
    assert " " not in c["text"], c["text"]
assert r["choices"][0]["token_ids"] == r["choices"][1]["token_ids"]  # greedy: n copies
PY
line 11 | grep -q '"id":"ok3",.*"finish_reason":"length"' || fail "ok3: $(line 11)"

# 4. asynchronous scheduling off: the same outputs
strip() { sed -e 's/"timings":{[^}]*}//' -e 's/"seed":[0-9]*,//' "$1"; }
$DSINFER run -m "$M" --tokenizer $TOK --input "$T/in.jsonl" --output "$T/out_sync.jsonl" \
    --no-progress --sync 2>"$T/err2" || fail "run --sync: $(cat "$T/err2")"
strip "$T/out.jsonl" >"$T/a"
strip "$T/out_sync.jsonl" >"$T/b"
cmp -s "$T/a" "$T/b" || fail "async and sync outputs differ: $(diff "$T/a" "$T/b" | head -5)"
echo ok
