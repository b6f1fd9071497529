/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <asyncmr/error.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace asyncmr::detail {

/**
 * @brief The raw floor the benchmarks hold asyncmr's resources to: `pairs` rounds of
 * `cudaMallocFromPoolAsync` + `cudaFreeAsync` of `bytes` bytes on `pool` and `stream`, and
 * nothing else. One definition for the C++ floor program and the in-process floor of
 * `python -m asyncmr bench`.
 *
 * @return the steady-clock nanoseconds the rounds took
 * @throws what `throw_cuda_error` throws, when a call fails
 */
inline std::int64_t raw_pool_pairs(cudaMemPool_t pool,
                                   cudaStream_t stream,
                                   std::size_t bytes,
                                   std::int64_t pairs)
{
  auto const t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < pairs; ++i) {
    void* ptr = nullptr;
    if (auto const e = cudaMallocFromPoolAsync(&ptr, bytes, pool, stream); e != cudaSuccess) {
      throw_cuda_error(e, "cudaMallocFromPoolAsync");
    }
    if (auto const e = cudaFreeAsync(ptr, stream); e != cudaSuccess) {
      throw_cuda_error(e, "cudaFreeAsync");
    }
  }
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              t0)
    .count();
}

}  // namespace asyncmr::detail
