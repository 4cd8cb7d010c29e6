#!/usr/bin/env bash
# clang-format 14 over the C, CUDA and HIP sources with the root .clang-format.
#   tools/check_format.sh          fails (and lists the files) when any file would change
#   tools/check_format.sh --fix    rewrites those files in place
# The files are the tracked *.c *.h *.cu *.cuh *.cpp under core/ backends/ include/ tests/
# bench/ examples/ (git ls-files, so build folders never count).
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}
if [ -z "$fmt" ]; then
  echo "check_format: clang-format 14 not found (set CLANG_FORMAT)" >&2
  exit 2
fi
case "$("$fmt" --version)" in
*" 14."*) ;;
*) echo "check_format: $fmt is not clang-format 14; its output differs between versions" >&2; exit 2 ;;
esac
mapfile -t files < <(git ls-files -- 'core/*' 'backends/*' 'include/*' 'tests/*' 'bench/*' \
  'examples/*' | grep -E '\.(c|h|cu|cuh|cpp)$')
if [ "${1:-}" = "--fix" ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check_format: %d file(s) not formatted (tools/check_format.sh --fix):\n' ${#bad[@]} >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
