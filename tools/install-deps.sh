#!/bin/sh
# Installs what dsinfer's build and tests need on Debian/Ubuntu: a C compiler, make, jansson
# (JSON), PCRE2 (tokenizer regex); clang + libFuzzer and clang-format for `make check`;
# python3 + pip and the Python packages of ref/requirements-ci.txt for the tokenizer and
# grammar reference tests. Safe to run twice.
set -eu
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq gcc make libjansson-dev libpcre2-dev clang libclang-rt-14-dev \
    clang-format python3 python3-pip >/dev/null ||
    $SUDO apt-get install -y -qq gcc make libjansson-dev libpcre2-dev clang clang-format \
        python3 python3-pip >/dev/null
cd "$(dirname "$0")/.."
python3 -m pip install -q -r ref/requirements-ci.txt 2>/dev/null ||
    python3 -m pip install -q --break-system-packages -r ref/requirements-ci.txt
