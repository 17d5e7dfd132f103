#!/usr/bin/env bash
# Build llama.cpp's `llama-server` for the managed server's llama.cpp engine
# (executor.serve.engine: llama.cpp; docs/executors.md, "A managed server").
#
#   scripts/build_llama_server.sh DEST [PYTHON]
#
# The source is llama.cpp as vendored in the llama-cpp-python sdist from PyPI, pinned by
# version and sha256 below (PyPI is the one source a fresh machine here reaches). It is built
# for this CPU (GGML_NATIVE), as one static program without web page, HTTPS or downloads, and
# installed as DEST. About 6 minutes on 2 cores; needs cmake and a C++ compiler.
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

dest=${1:?usage: build_llama_server.sh DEST [PYTHON]}
python=${2:-python3}
for tool in cmake c++; do
    command -v "$tool" >/dev/null ||
        { echo "llama-server: the build needs $tool, which is not on the PATH" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "llama-server: fetching llama-cpp-python $VERSION (llama.cpp source) from PyPI"
"$python" -m pip download --quiet --no-deps "llama-cpp-python==$VERSION" -d "$work"
archive="$work/llama_cpp_python-$VERSION.tar.gz"
echo "$SHA256  $archive" | sha256sum --check --quiet
tar -xzf "$archive" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"

echo "llama-server: building (about 6 minutes on 2 cores)"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$work/cmake.log" 2>&1 ||
    { tail -20 "$work/cmake.log"; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log"; exit 1; }
install -m 755 "$work/build/bin/llama-server" "$dest"
echo "llama-server: installed $dest"
