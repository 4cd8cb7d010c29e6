#!/usr/bin/env bash
# Runs the libFuzzer harness for a bounded time with a fixed seed; fails on any finding.
#
#   tests/fuzz/run_fuzz.sh <build-dir> [seconds]     (default 180)
#
# <build-dir> was configured with CC=clang -DFLASHPORT_FUZZ=ON -DFLASHPORT_SANITIZE=ON (see
# .ci/run). New inputs go to <build-dir>/fuzz_corpus (the committed seeds in tests/fuzz/corpus
# are read, never written); a crashing input is saved as <build-dir>/fuzz-crash-*, which
# `<build-dir>/bin/fuzz_corpus <file>` (or fuzz_attention <file>) replays.
set -euo pipefail
build=${1:?usage: run_fuzz.sh <build-dir> [seconds]}
seconds=${2:-180}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$build/fuzz_corpus"
# The cpu backend runs its default micro-kernel table (avx512bf16 where the CPU has AVX512-BF16,
# with bf16 products in the backward); the harness's error bound (fuzz_bound.c) allows the
# rounding of P and dS to the storage dtype. FLASHPORT_CPU_ISA=avx512 (or avx2, scalar) in the
# environment fuzzes another table.
# The harness aborts on a violated property; allocator_may_return_null: B = 0 calls and the like
# are not allocation findings.
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$build/bin/fuzz_attention" -seed=22 -max_total_time="$seconds" -timeout=30 -rss_limit_mb=3072 \
  -max_len=256 -print_final_stats=1 -artifact_prefix="$build/fuzz-" \
  "$build/fuzz_corpus" "$root/tests/fuzz/corpus"
