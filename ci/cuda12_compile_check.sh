#!/usr/bin/env bash
# Compile-only check of the CUDA 12.6 path (no GPU, no CUDA 12 toolkit needed): the C++ sources
# against the CUDA 12.6 runtime headers and librmm-cu12's CCCL, all from PyPI wheels. Guards the
# `#if CUDART_VERSION` branches that a CUDA 13 build never compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
  --platform manylinux_2_5_x86_64 -d "$work/wheels" \
  'nvidia-cuda-runtime-cu12==12.6.*' 'nvidia-cuda-nvcc-cu12==12.6.*' 'librmm-cu12==26.10.*' \
  'rapids-logger==0.3.*'
for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/x"; done
x=$work/x
grep -q 'define CUDART_VERSION  12060' "$x/nvidia/cuda_runtime/include/cuda_runtime_api.h"
for src in src/*.cpp; do
  g++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror -Iinclude -I"$x/librmm/include/rapids" \
    -isystem "$x/librmm/include" -isystem "$x/rapids_logger/include" \
    -isystem "$x/nvidia/cuda_runtime/include" -isystem "$x/nvidia/cuda_nvcc/include" \
    -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR \
    -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR "$src"
  echo "CUDA 12.6 headers: $src compiles"
done
