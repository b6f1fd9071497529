/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include "test_kernels.hpp"

namespace asyncmr::test {
namespace {

constexpr unsigned block_size = 256;

__global__ void fill_kernel(std::uint32_t* words, std::size_t count, std::uint32_t seed)
{
  auto const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (auto i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    words[i] = pattern_word(i, seed);
  }
}

__global__ void count_mismatches_kernel(std::uint32_t const* words,
                                        std::size_t count,
                                        std::uint32_t seed,
                                        unsigned long long* mismatches)
{
  auto const stride        = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (auto i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    if (words[i] != pattern_word(i, seed)) { ++local; }
  }
  if (local != 0) { atomicAdd(mismatches, local); }
}

unsigned grid_for(std::size_t count)
{
  auto const blocks = (count + block_size - 1) / block_size;
  return static_cast<unsigned>(blocks == 0 ? 1 : (blocks > 1024 ? 1024 : blocks));
}

}  // namespace

cudaError_t launch_fill(std::uint32_t* words,
                        std::size_t count,
                        std::uint32_t seed,
                        cudaStream_t stream)
{
  fill_kernel<<<grid_for(count), block_size, 0, stream>>>(words, count, seed);
  return cudaGetLastError();
}

cudaError_t launch_count_mismatches(std::uint32_t const* words,
                                    std::size_t count,
                                    std::uint32_t seed,
                                    unsigned long long* mismatches,
                                    cudaStream_t stream)
{
  count_mismatches_kernel<<<grid_for(count), block_size, 0, stream>>>(
    words, count, seed, mismatches);
  return cudaGetLastError();
}

}  // namespace asyncmr::test
