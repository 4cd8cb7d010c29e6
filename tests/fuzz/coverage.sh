#!/usr/bin/env bash
# Line coverage of core/ and backends/cpu/ reached by the fuzz corpus (and optionally by the whole
# test suite), with gcc --coverage and gcov: the figures of docs/reliability.md.
#
#   tests/fuzz/coverage.sh <build-dir> [corpus-dir ...]      (default: tests/fuzz/corpus)
#   COVERAGE_CTEST="-LE memory" tests/fuzz/coverage.sh ...    also run ctest with these arguments
#
# Configures <build-dir> with gcc --coverage, OpenMP on, no GPU backends, runs fuzz_corpus over
# the corpus folders, and prints per-folder totals of executable lines run.
set -euo pipefail
build=${1:?usage: coverage.sh <build-dir> [corpus-dir ...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] || set -- "$root/tests/fuzz/corpus"
CC=gcc cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DFLASHPORT_CUDA=OFF \
  -DFLASHPORT_HIP=OFF -DFLASHPORT_BUILD_BENCH=OFF -DCMAKE_C_FLAGS="--coverage -O1" \
  -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage \
  -DCMAKE_MODULE_LINKER_FLAGS=--coverage >/dev/null
cmake --build "$build" -j2 >/dev/null
find "$build" -name '*.gcda' -delete
if [ -n "${COVERAGE_CTEST:-}" ]; then
  # shellcheck disable=SC2086 # the variable holds several ctest arguments
  ctest --test-dir "$build" -j2 $COVERAGE_CTEST >/dev/null || echo "coverage.sh: some tests failed"
fi
"$build/bin/fuzz_corpus" "$@"
# gcov per object of the library (CMake names them <source>.o, notes <source>.gcno); the shared
# library and the tests' static flashport_internal are made of the same objects, so a ctest run
# counts the tests linked to either. Totals per source folder.
objdir="$build/CMakeFiles/flashport_objects.dir"
for gcda in $(cd "$objdir" && find . -name '*.gcda' | sort); do
  rel=${gcda#./}
  rel=${rel%.gcda}
  (cd "$objdir" && gcov -n -o "$rel.o" "$root/$rel" 2>/dev/null) |
    awk -v f="$rel" '/^Lines executed/ { split($2, a, ":"); sub("%", "", a[2]); print f, a[2], $4; exit }'
done | awk '
  { dir = $1; sub("/[^/]*$", "", dir); run = $2 * $3 / 100; lines[dir] += $3; hit[dir] += run
    printf "  %-36s %6.1f%% of %d lines\n", $1, $2, $3 }
  END { for (d in lines) printf "%-14s %6.1f%% of %d lines\n", d "/", 100 * hit[d] / lines[d], lines[d] }'
