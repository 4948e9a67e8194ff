#!/usr/bin/env bash
# Builds llama.cpp for this CPU from the source vendored in the PyPI sdist of llama-cpp-python,
# into a cache keyed by version: ${SPECMOE_LLAMA_CPP_CACHE:-~/.cache/specmoe/llama.cpp}/<version>/
#   sdist/   the sdist as pip downloaded it (its sha256 is checked against the pin below)
#   src/     the sdist's vendor/llama.cpp (convert_hf_to_gguf.py and gguf-py come from here)
#   build/   CMake + Ninja, Release, GGML_NATIVE; the tools in build/bin, libllama/libggml
#   BUILT    written last, listing the tools: when it is present nothing is downloaded or built
# Nothing is fetched at build time: the prebuilt web UI, the npm UI build and OpenSSL are off,
# and the targets built are only the ones below (the tests' model downloads are ctest steps,
# never run here). Usage: scripts/build_llama_cpp.sh [--force]   (env: PYTHON, JOBS)
set -euo pipefail

VERSION=0.3.36
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TOOLS=(llama-bench llama-speculative-simple llama-server llama-cli llama-simple
       llama-tokenize test-backend-ops)
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-2}

ROOT="${SPECMOE_LLAMA_CPP_CACHE:-$HOME/.cache/specmoe/llama.cpp}/$VERSION"
SDIST="$ROOT/sdist/llama_cpp_python-$VERSION.tar.gz"
SRC="$ROOT/src"
BUILD="$ROOT/build"
STAMP="$ROOT/BUILT"

if [ "${1:-}" = "--force" ]; then rm -f "$STAMP"; fi
if [ -f "$STAMP" ]; then
    missing=0
    for t in "${TOOLS[@]}"; do [ -x "$BUILD/bin/$t" ] || missing=1; done
    if [ "$missing" = 0 ]; then
        echo "llama.cpp $VERSION: built ($ROOT)"
        exit 0
    fi
    rm -f "$STAMP"
fi

for prog in cmake ninja cc c++; do
    command -v "$prog" >/dev/null 2>&1 || { echo "make llama-cpp: $prog not found" >&2; exit 1; }
done

mkdir -p "$ROOT/sdist"
if [ ! -f "$SDIST" ]; then
    echo "llama.cpp $VERSION: downloading the llama-cpp-python sdist"
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" \
        -d "$ROOT/sdist"
fi
got=$(sha256sum "$SDIST" | cut -d' ' -f1)
if [ "$got" != "$SDIST_SHA256" ]; then
    echo "make llama-cpp: $SDIST has sha256 $got, expected $SDIST_SHA256" >&2
    exit 1
fi

if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "llama.cpp $VERSION: extracting vendor/llama.cpp"
    rm -rf "$SRC" "$ROOT/src.tmp"
    mkdir -p "$ROOT/src.tmp"
    tar -xzf "$SDIST" -C "$ROOT/src.tmp" --strip-components=3 \
        "llama_cpp_python-$VERSION/vendor/llama.cpp"
    mv "$ROOT/src.tmp" "$SRC"
fi

echo "llama.cpp $VERSION: building ${TOOLS[*]} (-j$JOBS)"
cmake -S "$SRC" -B "$BUILD" -G Ninja -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_EXAMPLES=ON \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON >"$ROOT/cmake.log"
cmake --build "$BUILD" -j "$JOBS" --target "${TOOLS[@]}" llama ggml

printf '%s\n' "version $VERSION" "sdist_sha256 $SDIST_SHA256" "${TOOLS[@]}" >"$STAMP"
echo "llama.cpp $VERSION: built ($ROOT)"
