#!/usr/bin/env bash
# Runs a test with FLASHPORT_LOG=1 and requires, besides its passing, that the library's log names
# what the test is meant to exercise (e.g. the kernel variant), so a silent fallback to another
# path cannot pass. Exit status: the test's when it fails or skips (77), else 1 when the log
# lacks the pattern.
#
#   tests/opencl/expect_log.sh REGEX COMMAND [ARGS...]
set -uo pipefail
want=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
FLASHPORT_LOG=1 "$@" 2>"$log"
rc=$?
if [ $rc -ne 0 ]; then
    tail -20 "$log"
    exit $rc
fi
if ! grep -Eq "$want" "$log"; then
    echo "expect_log: the test passed but the log never says /$want/; its last lines:"
    tail -20 "$log"
    exit 1
fi
echo "expect_log: the log says /$want/ $(grep -Ec "$want" "$log") times"
