#!/usr/bin/env bash
# Build llama.cpp's own tools natively (-march=native) from the llama.cpp source that the pinned
# llama-cpp-python sdist carries (requirements/llama.txt), install them into specgen's cache
#   <cache>/llama.cpp/<version>/bin   llama-speculative-simple, llama-simple, llama-bench
#   <cache>/llama.cpp/<version>/lib   libllama.so, libggml*.so, libllama-common.so (shared)
# then install the Python bindings from the same sdist without a library of their own
# (-DLLAMA_BUILD=OFF): specgen points them at that lib folder (LLAMA_CPP_LIB_PATH), so the bench's
# `llamacpp` and `llamacpp-spec` contestants run one and the same native build.
#
#   PYTHON=.venv/bin/python scripts/build_llamacpp.sh      (what `make llamacpp` runs)
#
# Variables: PYTHON (the venv's python, default python3), JOBS (default 2), SPECGEN_CACHE_DIR
# (the cache root; default the one specgen.paths uses), SKIP_BINDINGS=1 (tools only).
# Needs cmake, a C++17 compiler and the network for the sdist and the bindings' build backend.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-2}"
version="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' "$here/requirements/llama.txt")"
[ -n "$version" ] || { echo "no llama-cpp-python==X pin in requirements/llama.txt" >&2; exit 1; }

cache="${SPECGEN_CACHE_DIR:-$(PYTHONPATH="$here/src" "$PYTHON" -c 'from specgen.paths import cache_dir; print(cache_dir())')}"
prefix="$cache/llama.cpp/$version"
work="$prefix/build-tree"
sdist="$work/llama_cpp_python-$version.tar.gz"
mkdir -p "$work"
start=$(date +%s)

if [ ! -f "$sdist" ]; then
  echo "== downloading the llama-cpp-python $version sdist"
  "$PYTHON" -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work"
fi
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[ -d "$src" ] || tar -xzf "$sdist" -C "$work"

# Only the targets the bench needs: llama-cli would pull in the whole server.
targets=(llama-speculative-simple llama-simple llama-bench)
# -march=native, less ggml's AMX kernels: on an AMX Xeon they segfault in
# ggml_backend_amx_mul_mat on any prompt of more than one token (llama-simple too; this release
# and the README's Limitations). -U__AMX_INT8__ takes away the macro that compiles them, while
# -march=native keeps every other instruction set; a CPU without AMX never defines it.
noamx="-U__AMX_INT8__"
echo "== configuring llama.cpp ($src)"
cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN/../lib'
echo "== building ${targets[*]} with $JOBS jobs"
cmake --build "$work/build" --config Release -j "$JOBS" --target "${targets[@]}"

echo "== installing into $prefix"
mkdir -p "$prefix/bin" "$prefix/lib"
for t in "${targets[@]}"; do install -m 755 "$work/build/bin/$t" "$prefix/bin/$t"; done
# Shared libraries keep their soname links (cp -P): libllama.so -> libllama.so.0 -> ...
find "$work/build/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -P {} "$prefix/lib/" \;
"$prefix/bin/llama-speculative-simple" --version 2>&1 | tail -n 2 || true

if [ "${SKIP_BINDINGS:-0}" != 1 ]; then
  echo "== installing the llama-cpp-python $version bindings (no bundled library) into $PYTHON"
  CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$PYTHON" -m pip install -q --force-reinstall --no-deps "$sdist"
  "$PYTHON" -m pip install -q "llama-cpp-python==$version"   # its own dependencies
  LLAMA_CPP_LIB_PATH="$prefix/lib" "$PYTHON" -c \
    'import llama_cpp; print("bindings", llama_cpp.__version__, "->", llama_cpp.llama_cpp._base_path)'
fi
echo "== done in $(( $(date +%s) - start ))s: $prefix/bin, $prefix/lib"
