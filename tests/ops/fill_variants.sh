#!/bin/bash
# fill_variants.sh - write build/variants/<name>/ for tests/ops/gpu_ab_trees.sh from git refs, on
# the development machine: the trees src, include, tests (less tests/golden: ~1.5 MB a variant,
# within the device tool's carry limit), tools and the Makefile of each ref (so a variant may
# change the forward pass, the backend interface or the tests, not only src/backend/cuda). Usage (repository root): bash tests/ops/fill_variants.sh NAME=REF ...
#   bash tests/ops/fill_variants.sh before=HEAD~3 new=HEAD
# then carry build/variants (with build/deps) and run AB_TREES="before new" gpu_ab_trees.sh.
set -eu
[ $# -gt 0 ] || { echo "usage: $0 NAME=REF ..." >&2; exit 2; }
for a in "$@"; do
    name=${a%%=*} ref=${a#*=}
    [ -n "$name" ] && [ "$name" != "$a" ] || { echo "$0: '$a': want NAME=REF" >&2; exit 2; }
    git rev-parse --verify -q "$ref^{commit}" >/dev/null || { echo "$0: $ref: not a commit" >&2; exit 2; }
    rm -rf "build/variants/$name" && mkdir -p "build/variants/$name"
    git archive "$ref" src include tests tools Makefile ':(exclude)tests/golden' | tar -x -C "build/variants/$name"
    echo "build/variants/$name: $(git rev-parse --short "$ref") ($(du -sh "build/variants/$name" | cut -f1))"
done
