#!/bin/sh
# `dsinfer run` (JSONL in, JSONL out) and `dsinfer bench sweep` on the tiny golden checkpoint:
# one output line per request in input order, per-request errors for bad lines (malformed
# JSON, unknown field, invalid UTF-8, negative max_tokens, prompt longer than the context, id
# out of range) without disturbing the others, n > 1, logprobs, identical outputs with
# asynchronous scheduling on and off, stdin/stdout; the sweep's CSV and SVG. On the default
# model (models/dsv4-tiny, when present): text prompts, chat messages and stop strings.
set -u
M=tests/golden/tiny-a/model
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

if ! $DSINFER run --help >/dev/null 2>&1; then echo "skipped: no 'run' command"; exit 0; fi
[ -f $M/config.json ] || { echo "skipped: no $M"; exit 0; }

cat >"$T/in.jsonl" <<'EOF'
{"id": "g1", "prompt": [5, 17, 300, 42], "max_tokens": 6, "temperature": 0, "ignore_eos": true}
{"prompt_token_ids": [5, 6, 7, 8], "max_tokens": 5, "temperature": 0.9, "seed": 11, "n": 2, "logprobs": 2, "ignore_eos": true}

{"prompt": [5, 6], "max_tokens": -4}
{"prompt": [5, 6], "temprature": 0.5}
{"prompt": [5, 6], "max_tokens": 3
{"custom_id": 7, "prompt": [5, 99999]}
{"prompt": [5, 6], "stop": "x"}
{"id": "g2", "prompt": [5, 17, 300, 42], "max_tokens": 6, "temperature": 0, "ignore_eos": true, "top_logprobs": 3}
{"prompt": [9, 8, 7], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.01, "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "seed": 5, "stop_token_ids": [3]}
EOF
printf '{"prompt": "\377\376 bad utf-8"}\n' >>"$T/in.jsonl"
# a prompt longer than the context (--max-ctx 64)
python_free_ids=$(i=0; s=""; while [ $i -lt 80 ]; do s="$s${s:+,}$((i + 2))"; i=$((i + 1)); done; echo "$s")
echo "{\"prompt\": [$python_free_ids], \"max_tokens\": 2}" >>"$T/in.jsonl"

$DSINFER run -m $M --input "$T/in.jsonl" --output "$T/out.jsonl" --max-ctx 64 --threads 1 \
    2>"$T/err" || fail "run exited $?: $(cat "$T/err")"
[ "$(wc -l <"$T/out.jsonl")" -eq 11 ] || fail "want 11 output lines, got $(wc -l <"$T/out.jsonl")"
grep -q "11 requests (7 errors)" "$T/err" || fail "summary: $(tail -1 "$T/err")"
line() { sed -n "$1p" "$T/out.jsonl"; }
line 1 | grep -q '^{"line":1,"id":"g1","seed":[0-9]*,"choices":\[{"index":0,"token_ids":\[[0-9,]*\],"finish_reason":"length"' ||
    fail "line 1: $(line 1)"
line 2 | grep -q '"line":2,.*"index":1,.*"top_logprobs":\[\[{"id"' || fail "line 2 (n=2, logprobs): $(line 2)"
line 2 | grep -q '"usage":{"prompt_tokens":4,"completion_tokens":10,"total_tokens":14}' || fail "line 2 usage"
line 3 | grep -q '"line":4,"error":{"code":"invalid_request","message":"field \\"max_tokens\\"' || fail "line 3: $(line 3)"
line 4 | grep -q '"line":5,"error":{"code":"invalid_request","message":"unknown field \\"temprature\\""' || fail "line 4: $(line 4)"
line 5 | grep -q '"line":6,"error":{"code":"invalid_request","message":"malformed JSON' || fail "line 5: $(line 5)"
line 6 | grep -q '"line":7,"custom_id":7,"error":{.*out of range' || fail "line 6: $(line 6)"
line 7 | grep -q '"line":8,"error":{"code":"unsupported".*tokenizer' || fail "line 7: $(line 7)"
line 9 | grep -q '"line":10,"seed":5,' || fail "line 9: $(line 9)"
line 10 | grep -q '"line":11,"error":{"code":"invalid_request","message":"invalid UTF-8: unable to decode byte 0xff' || fail "line 10: $(line 10)"
line 11 | grep -q '"line":12,"error":{"code":"context_length_exceeded"' || fail "line 11: $(line 11)"
# the same greedy request twice gives the same tokens; timings are there
t1=$(line 1 | sed 's/.*"token_ids":\(\[[0-9,]*\]\).*/\1/')
t8=$(line 8 | sed 's/.*"choices":\[{"index":0,"token_ids":\(\[[0-9,]*\]\).*/\1/')
[ "$t1" = "$t8" ] || fail "greedy outputs differ: $t1 vs $t8"
line 1 | grep -q '"timings":{"queue_s":[-0-9.e]*,"ttft_s":[-0-9.e]*,"tpot_s":[-0-9.e]*,"total_s"' || fail "timings"

# asynchronous scheduling off: the same outputs (timings and random seeds aside); stdin/stdout
strip() { sed -e 's/"timings":{[^}]*}//' -e 's/"seed":[0-9]*,//' "$1"; }
$DSINFER run -m $M --input - --output - --max-ctx 64 --sync --threads 1 --no-progress \
    <"$T/in.jsonl" >"$T/out_sync.jsonl" 2>"$T/err2" || fail "run --sync: $(cat "$T/err2")"
strip "$T/out.jsonl" >"$T/a"
strip "$T/out_sync.jsonl" >"$T/b"
cmp -s "$T/a" "$T/b" || fail "async and sync outputs differ: $(diff "$T/a" "$T/b" | head -5)"
# a page budget smaller than the sequence slots: one error line naming the budget
$DSINFER run -m $M --input "$T/in.jsonl" --output "$T/o" --kv-mb 1 2>"$T/e" && fail "--kv-mb 1 accepted"
grep -q "kv budget" "$T/e" || fail "kv budget message: $(cat "$T/e")"

# bad invocations: one error line, exit code 1 or 2
$DSINFER run -m $M --input "$T/in.jsonl" 2>"$T/e" && fail "no --output accepted"
grep -q "output" "$T/e" || fail "missing --output message"
$DSINFER run -m $M --input "$T/nope.jsonl" --output "$T/o" 2>"$T/e" && fail "missing input accepted"
grep -q "nope.jsonl" "$T/e" || fail "missing input message"
$DSINFER run -m /nonexistent --input "$T/in.jsonl" --output "$T/o" 2>"$T/e"
rc=$?
[ $rc -eq 1 ] && grep -q "/nonexistent" "$T/e" || fail "bad model dir: rc $rc $(cat "$T/e")"

# bench sweep: CSV with provenance, SVG chart
$DSINFER bench sweep -m $M --concurrency 1,2 --input-len 8 --output-len 4 --threads 1 \
    --csv "$T/s.csv" --svg "$T/s.svg" >"$T/sweep.out" 2>&1 || fail "sweep: $(cat "$T/sweep.out")"
head -1 "$T/s.csv" | grep -q '^# git=.*; device=.*; model=.*; options=.*input_len=8' || fail "csv provenance"
[ "$(wc -l <"$T/s.csv")" -eq 4 ] || fail "csv rows"
sed -n 3p "$T/s.csv" | grep -q '^1,4,8,4,' || fail "csv row 1: $(sed -n 3p "$T/s.csv")"
grep -q '<svg' "$T/s.svg" && grep -q 'c=2' "$T/s.svg" || fail "svg"

# the default model (text, chat, stop strings), when it is there
D=models/dsv4-tiny
if [ -f $D/config.json ]; then
    cat >"$T/text.jsonl" <<'EOF'
{"prompt": "The jury said", "max_tokens": 12, "temperature": 0}
{"prompt": "The jury said", "max_tokens": 12, "temperature": 0, "stop": [" "]}
{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}
EOF
    $DSINFER run --input "$T/text.jsonl" --output "$T/text.out" --no-progress 2>"$T/err4" ||
        fail "default model: $(cat "$T/err4")"
    [ "$(wc -l <"$T/text.out")" -eq 3 ] || fail "default model: lines"
    grep -q '"error"' "$T/text.out" && fail "default model: $(cat "$T/text.out")"
    sed -n 1p "$T/text.out" | grep -q '"text":"' || fail "no text"
    sed -n 2p "$T/text.out" | grep -q '"text":"[^ "]*","token_ids".*"finish_reason":"stop","stop_reason":" "' ||
        fail "stop string: $(sed -n 2p "$T/text.out")"
fi
echo ok
