#!/usr/bin/env bash
# Line coverage of core/ and backends/cpu/ reached by the fuzz corpus (and optionally by the whole
# test suite), with gcc --coverage and gcov: the figures of docs/reliability.md.
#
#   tests/fuzz/coverage.sh <build-dir> [corpus-dir ...]      (default: tests/fuzz/corpus)
#   COVERAGE_CTEST=1 tests/fuzz/coverage.sh ...               also run ctest -LE memory first
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
if [ "${COVERAGE_CTEST:-0}" = 1 ]; then
  ctest --test-dir "$build" -j2 -LE memory >/dev/null || echo "coverage.sh: some tests failed"
fi
"$build/bin/fuzz_corpus" "$@"
# gcov per object of the shared library; totals per source folder.
objdir="$build/CMakeFiles/flashport.dir"
(cd "$objdir" && find . -name '*.gcda' | while read -r gcda; do
   src="$root/${gcda#./}"
   src="${src%.gcda}"
   src="${src%.o}"
   gcov -n -o "$(dirname "$gcda")" "$src" 2>/dev/null | awk -v f="$src" '
     /^File/ { file = $2; gsub("\047", "", file) }
     /^Lines executed/ && file == f { split($2, a, ":"); sub("%", "", a[2]); print f, a[2], $4 }'
 done) | awk -v root="$root/" '
  { f = $1; sub(root, "", f); dir = f; sub("/[^/]*$", "", dir)
    run = $2 * $3 / 100; lines[dir] += $3; hit[dir] += run
    printf "  %-36s %6.1f%% of %d lines\n", f, $2, $3 }
  END { for (d in lines) printf "%-14s %6.1f%% of %d lines\n", d "/", 100 * hit[d] / lines[d], lines[d] }'
