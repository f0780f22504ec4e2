#!/usr/bin/env bash
# The installed package as a user meets it:
#   test_install.sh <source dir> <build dir>
# Installs the build into a temporary prefix; checks the files, and that the shared libraries
# export only namespace dma (nm -D --defined-only); builds examples/ against the installed copy
# once through find_package(dma) (shared and static) and once through pkg-config (shared and
# static); runs each build's examples against each other and the client against a redis-server
# with the installed dma.so (run_examples.sh); and imports the installed Python package.
# Only the release-like builds run it (tests/CMakeLists.txt says why).
set -euo pipefail
source_dir=$1
build_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "test_install: $*" >&2; exit 1; }

cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" || {
  cat "$work/install.log"; fail "cmake --install failed"; }

libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build_dir/CMakeCache.txt")
libdir=$prefix/${libdir:-lib}
for file in include/dma/client.hpp include/dma/service.hpp include/dma/target.hpp \
            include/dma/export.hpp include/dma/version.hpp bin/dma-cli bin/dma-info; do
  [ -e "$prefix/$file" ] || fail "missing $file"
done
for file in libdma.so libdma.a libdma_client.so libdma_client.a dma/dma.so \
            cmake/dma/dmaConfig.cmake cmake/dma/dmaConfigVersion.cmake \
            pkgconfig/dma.pc pkgconfig/dma-client.pc; do
  [ -e "$libdir/$file" ] || fail "missing $libdir/$file"
done
[ -x "$libdir/dma/dma.so" ] || fail "the module is not executable (redis-server refuses it)"
grep -q '@' "$prefix/include/dma/version.hpp" && fail "version.hpp was not configured"
grep -q 'SONAME.*libdma\.so\.[0-9]' <<<"$(readelf -d "$libdir/libdma.so")" || fail "libdma.so has no versioned SONAME"

# Only the public API: every defined dynamic symbol is in namespace dma (or its vtables and
# type info), so nothing of libfabric, toml++, the standard library or src/ leaks.
for library in libdma.so libdma_client.so; do
  leaked=$(nm -D --defined-only "$libdir/$library" | c++filt | awk '{ $1 = ""; $2 = ""; print }' |
           sed 's/^ *//' | grep -v -E '^(dma::|vtable for dma::|typeinfo (name )?for dma::|VTT for dma::)' || true)
  [ -z "$leaked" ] || fail "$library exports more than the public API:"$'\n'"$leaked"
  symbols=$(nm -D --defined-only "$libdir/$library" | c++filt)
  grep -q -E 'dma::(FabricService::start|Client::connect)' <<<"$symbols" ||
    fail "$library exports neither FabricService nor Client"
done

# find_package(dma): shared (dma::dma, dma::client) and static (dma::client_static).
cmake -S "$source_dir/examples" -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "configuring examples/ failed"; }
cmake --build "$work/cmake" -j 2 >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building examples/ failed"; }
grep -q "$libdir/libdma_client.so" <<<"$(ldd "$work/cmake/dma-example-client")" ||
  fail "the find_package client does not use the installed libdma_client.so"
grep -q libdma <<<"$(ldd "$work/cmake/dma-example-client-static")" && fail "the static client links a shared libdma"
"$source_dir/tests/install/run_examples.sh" "$work/cmake" "$libdir/dma/dma.so"

# pkg-config: shared, then static (the archives by name; --static adds Requires.private).
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion dma)" = "$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build_dir/CMakeCache.txt")" ] ||
  fail "dma.pc has the wrong version"
mkdir -p "$work/pc"
cxx=${CXX:-c++}
$cxx -std=c++20 -O1 -o "$work/pc/dma-example-server" "$source_dir/examples/server.cpp" \
  $(pkg-config --cflags --libs dma) -Wl,-rpath,"$libdir"
$cxx -std=c++20 -O1 -o "$work/pc/dma-example-client" "$source_dir/examples/client.cpp" \
  $(pkg-config --cflags --libs dma-client) -Wl,-rpath,"$libdir"
# libdma_client.a and libdma.a, with their dependencies (dma's Requires.private) linked as
# shared libraries: `pkg-config --static` would also ask for libfabric's own static
# dependencies (libpsm2, libefa, ...), which Debian ships only as shared libraries.
deps=$(pkg-config --print-requires-private dma-client dma | awk '{ print $1 }' | sort -u)
static_libs="-L$libdir -l:libdma_client.a -l:libdma.a $(pkg-config --libs $deps) -pthread"
$cxx -std=c++20 -O1 -o "$work/pc/dma-example-client-static" "$source_dir/examples/client.cpp" \
  $(pkg-config --cflags dma-client) $static_libs
grep -q libdma <<<"$(ldd "$work/pc/dma-example-client-static")" && fail "the static pkg-config client links a shared libdma"
"$source_dir/tests/install/run_examples.sh" "$work/pc" "$libdir/dma/dma.so"

# The Python package, imported from the prefix alone (not from the build tree).
if [ -f "$build_dir/python/dma/__init__.py" ]; then
  site=$(find "$prefix" -path '*-packages/dma/__init__.py' -printf '%h\n' | head -1)
  [ -n "$site" ] || fail "the Python package was not installed"
  python=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
  (cd "$work" && PYTHONPATH=$(dirname "$site") "${python:-python3}" -c \
    'import dma, sys; assert dma.__file__.startswith(sys.argv[1]), dma.__file__; print("python: dma", dma.__version__, "from", dma.__file__)' "$prefix") ||
    fail "import dma from the prefix failed"
fi
echo "test_install: all passed"
