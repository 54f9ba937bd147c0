#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the sources vendored in llama-cpp-python's PyPI sdist
# (PyPI is the only network this needs) and cache the binary, for tests/test_llama_server.py.
#
#   scripts/build_llama_server.sh            build (or reuse) the pinned version
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 scripts/build_llama_server.sh
#
# The binary lands in  <cache>/llama-server/<version>-<flag hash>/llama-server  where <cache> is
# $SPECLEDGER_CACHE, else ~/.cache/specledger (the same root specledger's model cache uses);
# the test looks there, or at $SPECLEDGER_LLAMA_SERVER. A cached binary is reused: re-runs are
# instant. The build is CPU-only, static (no shared libggml to find at run time), without libcurl or
# OpenSSL, and native (GGML_NATIVE=ON, -march=native): llama.cpp at its best on the machine it runs on, the
# peer a user would build. A native binary dies with "illegal instruction" on a CPU that lacks one of its
# instructions, so the cache key holds the CPU's instruction-set flags too: another CPU gets its own build.
# The cache folder is keyed by the version and a hash of the flags and the CPU's flags, so changing any rebuilds.
# The last line printed is always the binary's path (`make llama-server` runs this script); a cold build
# took 374 s of compiling with -j2 on 2 cores (6 min 25 s with the sdist download and cmake).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
CACHE=${SPECLEDGER_CACHE:-$HOME/.cache/specledger}
FLAGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
-DGGML_NATIVE=ON \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON"
# the instruction-set extensions -march=native may use (sorted, so the key is stable)
CPU_ISA=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' \
  | grep -E '^(sse|ssse|avx|fma|f16c|bmi|vnni|amx|sha|aes|popcnt|movbe|lzcnt|gfni|vaes|vpclmul)' | sort -u | tr '\n' ' ')
KEY=$(printf '%s|%s' "$FLAGS" "$CPU_ISA" | sha256sum | cut -c1-10)
DEST="$CACHE/llama-server/$VERSION-$KEY"
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

if [ -x "$DEST/llama-server" ]; then
  echo "cached build: $DEST/BUILD_INFO"
  echo "$DEST/llama-server"
  exit 0
fi
command -v cmake >/dev/null || { echo "cmake is needed (apt-get install cmake, or pip install cmake)" >&2; exit 1; }
command -v c++ >/dev/null || { echo "a C++ compiler is needed (apt-get install g++)" >&2; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  "llama-cpp-python==$VERSION" -d "$WORK" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -f "$SRC/CMakeLists.txt" ] || { echo "no vendored llama.cpp in the sdist ($SRC)" >&2; exit 1; }

# shellcheck disable=SC2086  # FLAGS is a list of words
cmake -S "$SRC" -B "$WORK/build" $FLAGS >"$WORK/cmake.log" 2>&1 \
  || { tail -40 "$WORK/cmake.log" >&2; exit 1; }
start=$(date +%s)
cmake --build "$WORK/build" --config Release --target llama-server -j "$JOBS" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log" >&2; exit 1; }
secs=$(( $(date +%s) - start ))

mkdir -p "$DEST.tmp"
cp "$WORK/build/bin/llama-server" "$DEST.tmp/llama-server"
{
  echo "llama-cpp-python sdist: $VERSION"
  echo "vendored llama.cpp commit: $(git -C "$SRC" log -1 --format='%H (%cs)' 2>/dev/null || echo unknown)"
  echo "llama-server --version: $("$DEST.tmp/llama-server" --version 2>&1 | tr '\n' ' ')"
  echo "built: $(date -u +%FT%TZ) in ${secs}s with -j$JOBS on $(uname -m)"
  echo "cmake flags: $FLAGS"
  echo "instruction set (native): $CPU_ISA"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')"
} >"$DEST.tmp/BUILD_INFO"
rm -rf "$DEST" && mv "$DEST.tmp" "$DEST"
cat "$DEST/BUILD_INFO"
echo "$DEST/llama-server"
