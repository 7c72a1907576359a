#!/bin/sh
# Runs every tests/cli/t_*.sh with $DSINFER set to the binary; each script exits non-zero on
# failure. Prints one summary line.
set -u
DSINFER=${DSINFER:-build/dsinfer}
export DSINFER
pass=0
fail=0
for t in tests/cli/t_*.sh; do
    [ -f "$t" ] || continue
    printf '%-48s ' "$(basename "$t")" >&2
    if sh "$t" >"build/$(basename "$t").log" 2>&1; then
        echo ok >&2
        pass=$((pass + 1))
    else
        echo FAILED >&2
        tail -n 30 "build/$(basename "$t").log" >&2
        fail=$((fail + 1))
    fi
done
echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
