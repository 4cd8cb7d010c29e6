#!/usr/bin/env bash
# Compares the SASS of every kernel in two builds of libflashport_cuda.so, kernel by kernel, with
# addresses, branch targets and symbol names normalized away. Per kernel and architecture it
# prints "same", "regs" (the same instructions in the same order, only register numbers and the
# encodings that carry them differ) or "DIFFERS" (with the count of differing lines); exits 1
# when any kernel is not "same".
#   tools/sass_diff.sh OLD.so NEW.so [CUOBJDUMP]
# CUOBJDUMP defaults to the one in CUDA_HOME / PATH, else pip triton's backends/nvidia/bin.
set -euo pipefail
old=$1 new=$2
dump=${3:-$(command -v cuobjdump || true)}
if [ -z "$dump" ]; then
  dump=$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))")/backends/nvidia/bin/cuobjdump
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
split_kernels() { # $1: .so, $2: output dir; one file per (arch, kernel), normalized
  mkdir -p "$2"
  "$dump" --dump-sass "$1" | awk -v dir="$2" '
    /code for sm_/ { arch = $NF }
    /^Fatbin (elf|ptx) code:/ { file = ""; next } # the next section header, not the last kernel
    /Function : / { name = $3; file = dir "/" arch "." name; next }
    file != "" {
      line = $0
      gsub(/\/\*[0-9a-f]+\*\//, "", line)          # instruction addresses
      gsub(/\/\* 0x[0-9a-f]+ \*\//, "", line)   # encodings (control bits, registers)
      gsub(/0x[0-9a-f]+/, "X", line)               # immediates that are offsets / targets
      gsub(/`\([^)]*\)/, "`(SYM)", line)           # symbol references
      gsub(/[ \t]+/, " ", line)
      if (line ~ /^ *$/) next
      print line >> file
    }'
}
regs() { sed -E 's/\bU?R[0-9]+\b/R/g; s/\bU?P[0-9]\b/P/g; s/\bB[0-9]+\b/B/g'; }
split_kernels "$old" "$work/old"
split_kernels "$new" "$work/new"
status=0
for f in $(ls "$work/old" "$work/new" | grep -v ':$' | sort -u); do
  if [ ! -f "$work/old/$f" ] || [ ! -f "$work/new/$f" ]; then
    echo "ONLY IN ONE: $f"; status=1
  elif cmp -s "$work/old/$f" "$work/new/$f"; then
    echo "same     $f"
  elif cmp -s <(regs < "$work/old/$f") <(regs < "$work/new/$f"); then
    echo "regs     $f"; status=1
  else
    echo "DIFFERS  $f ($(diff "$work/old/$f" "$work/new/$f" | grep -c '^[<>]') lines)"; status=1
  fi
done
exit $status
