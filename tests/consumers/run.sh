#!/usr/bin/env bash
# Proves that flashport can be installed and embedded, from outside the source tree:
#   1. cmake --install <build> into a fresh prefix; the installed bench starts (RUNPATH) and every
#      plugin the build made sits next to the installed library;
#   2. a find_package(flashport) project and 3. a pkg-config build of the same consumer
#      (tests/consumers/consumer.c: a checked causal forward on the CPU backend), each run;
#   4. a parent project that add_subdirectory()s the source tree, run, with its cache free of a
#      forced CMAKE_BUILD_TYPE.
#
#   tests/consumers/run.sh <configured and built flashport build folder> [work folder]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh <build folder> [work folder]}" && pwd)
work=${2:-$(mktemp -d)}
rm -rf "$work" && mkdir -p "$work"
work=$(cd "$work" && pwd)
prefix=$work/prefix
src=$work/src # the consumers, copied out of the tree
cp -r "$root/tests/consumers/." "$src"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)

echo "== install into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libflashport.so' | head -1)")
test -f "$prefix/include/flashport.h"
test -f "$libdir/cmake/flashport/flashportConfig.cmake"
test -f "$libdir/cmake/flashport/flashportConfigVersion.cmake"
test -f "$libdir/pkgconfig/flashport.pc"
for plugin in "$build"/lib/libflashport_*.so; do
  [ -e "$plugin" ] || continue
  test -f "$libdir/$(basename "$plugin")" || { echo "plugin $(basename "$plugin") not installed"; exit 1; }
done
if [ -x "$prefix/bin/flashport-bench" ]; then
  "$prefix/bin/flashport-bench" --help >/dev/null
  echo "installed flashport-bench starts"
fi

echo "== find_package(flashport)"
cmake -S "$src/find_package" -B "$work/fp" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/fp" >/dev/null
"$work/fp/consumer"

echo "== pkg-config flashport"
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -std=c11 -o "$work/pc_consumer" "$src/consumer.c" $(pkg-config --cflags flashport) \
  $(pkg-config --libs flashport) -lm -Wl,-rpath,"$(pkg-config --variable=libdir flashport)"
"$work/pc_consumer"

echo "== add_subdirectory(flashport)"
cmake -S "$src/subproject" -B "$work/sub" "${gen[@]}" -DFLASHPORT_DIR="$root" >/dev/null
if grep -q '^CMAKE_BUILD_TYPE:STRING=Release' "$work/sub/CMakeCache.txt"; then
  echo "flashport forced CMAKE_BUILD_TYPE into the parent's cache"
  exit 1
fi
cmake --build "$work/sub" >/dev/null
"$work/sub/consumer"
echo "consumers: install, find_package, pkg-config and add_subdirectory all work"
