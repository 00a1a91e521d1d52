#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (a benchmark peer for Hearth) from the llama.cpp sources
# vendored in the llama-cpp-python sdist, so it runs exactly the llama.cpp that Hearth's wheel runs.
# Idempotent: the binary is cached at $HEARTH_CACHE/llama-server/<version>/llama-server and reused.
# Prints the binary path as the last line of output.
#
# Same portable CPU flags as scripts/setup.sh (the native build segfaults here because of AMX).
# Extra flags, none of which changes inference code:
#   BUILD_SHARED_LIBS=OFF                      one self-contained binary that can be cached alone
#   LLAMA_USE_PREBUILT_UI=OFF LLAMA_BUILD_UI=OFF  no web UI: it would be downloaded or built with npm
#   LLAMA_OPENSSL=OFF                          the server only listens on plain HTTP on loopback
#
# Env: LLAMA_CPP_VERSION (default 0.3.36), HEARTH_CACHE (default ~/.cache/hearth),
#      LLAMA_CPP_SRC (optional: an already extracted vendor/llama.cpp to build from, skips download),
#      JOBS (default 2).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${LLAMA_CPP_VERSION:-0.3.36}"
cache="${HEARTH_CACHE:-$HOME/.cache/hearth}"
jobs="${JOBS:-2}"
out_dir="$cache/llama-server/$version"
bin="$out_dir/llama-server"

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "build_llama_server: reusing $bin" >&2
  echo "$bin"
  exit 0
fi

if [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"; else py="${PYTHON:-python3}"; fi
for tool in cmake c++ tar; do
  command -v "$tool" >/dev/null || { echo "build_llama_server: '$tool' not found (apt-get install cmake g++)" >&2; exit 1; }
done

work="$cache/llama-server/build-$version"
mkdir -p "$work" "$out_dir"

src="${LLAMA_CPP_SRC:-}"
if [ -z "$src" ]; then
  src="$work/src/llama_cpp_python-$version/vendor/llama.cpp"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    sdist=$(ls "$work"/llama_cpp_python-"$version".tar.gz 2>/dev/null | head -1 || true)
    if [ -z "$sdist" ]; then
      echo "build_llama_server: downloading llama-cpp-python $version sdist" >&2
      "$py" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work" >&2
      sdist="$work/llama_cpp_python-$version.tar.gz"
    fi
    rm -rf "$work/src" && mkdir -p "$work/src"
    tar -xzf "$sdist" -C "$work/src" "llama_cpp_python-$version/vendor/llama.cpp"
  fi
fi
[ -f "$src/CMakeLists.txt" ] || { echo "build_llama_server: no llama.cpp sources at $src" >&2; exit 1; }

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
build="$work/build"
# A cache configured for another source tree cannot be reused.
if [ -f "$build/CMakeCache.txt" ] && ! grep -qF "CMAKE_HOME_DIRECTORY:INTERNAL=$(cd "$src" && pwd)" "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
echo "build_llama_server: configuring $src" >&2
cmake -S "$src" -B "$build" "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
echo "build_llama_server: building llama-server with -j$jobs (several minutes on 2 cores)" >&2
cmake --build "$build" --config Release --target llama-server -j "$jobs" >&2

cp "$build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" --version >&2 || true
echo "$bin"
