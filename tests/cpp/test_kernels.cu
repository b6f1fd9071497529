/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The kernels the tests launch. nvcc compiles this file alone into a fatbin (sm_90 SASS and
// PTX, see CMakeLists.txt) that the test binary embeds and loads through the driver API
// (test_kernels.cpp): nothing here is linked against a CUDA runtime, so the same kernels serve
// builds against the CUDA 12 and the CUDA 13 runtime. The names are extern "C" because the
// loader looks them up by name.

#include "test_kernels.hpp"

namespace {

__device__ unsigned long long grid_stride()
{
  return static_cast<unsigned long long>(gridDim.x) * blockDim.x;
}

__device__ unsigned long long first_index()
{
  return static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}

}  // namespace

extern "C" __global__ void asyncmr_test_fill(std::uint32_t* words,
                                             unsigned long long count,
                                             std::uint32_t seed)
{
  for (auto i = first_index(); i < count; i += grid_stride()) {
    words[i] = asyncmr::test::pattern_word(i, seed);
  }
}

extern "C" __global__ void asyncmr_test_count_mismatches(std::uint32_t const* words,
                                                         unsigned long long count,
                                                         std::uint32_t seed,
                                                         unsigned long long* mismatches)
{
  unsigned long long local = 0;
  for (auto i = first_index(); i < count; i += grid_stride()) {
    if (words[i] != asyncmr::test::pattern_word(i, seed)) { ++local; }
  }
  if (local != 0) { atomicAdd(mismatches, local); }
}
