#!/usr/bin/env bash
# Builds the binaries for the GPU machine into build-gpu/ (see GPU.md, "Build here, run
# there"): C++ runtime and CUDA runtime linked statically, PCRE2/xxHash/liburing from their
# static archives, cuBLASLt dynamic; then strips dsinfer and unit_cuda into build-gpu/bin/,
# ready to carry with tools/gpu_check.sh (BIN_DIR=build-gpu/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_DIR="${CCACHE_DIR:-$PWD/.cache/ccache}"
jobs="${DSINFER_BUILD_JOBS:-1}"
lib=/usr/lib/x86_64-linux-gnu
if [ ! -f build-gpu/build.ninja ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSINFER_STATIC_RUNTIME=ON \
    "-Dpkgcfg_lib_PCRE2_pcre2-8=$lib/libpcre2-8.a" "-Dpkgcfg_lib_XXHASH_xxhash=$lib/libxxhash.a" \
    "-Dpkgcfg_lib_URING_uring=$lib/liburing.a" "$@"
fi
cmake --build build-gpu -j "$jobs" --target dsinfer unit_cuda
mkdir -p build-gpu/bin
strip -o build-gpu/bin/dsinfer build-gpu/dsinfer
strip -o build-gpu/bin/unit_cuda build-gpu/unit_cuda
ldd build-gpu/bin/dsinfer
