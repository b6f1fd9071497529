/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file raw_pool_pairs.hpp
 * @brief The raw floor the benchmark holds asyncmr's resources to, defined once: used by the
 * `pool_floor` program and by the `asyncmr_floor` library (the in-process floor of the Python
 * benchmark). Benchmark code: nothing in the asyncmr library includes it.
 */

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace asyncmr_bench {

/// What one timed loop of raw pairs gives back.
struct raw_pairs_result {
  cudaError_t error{cudaSuccess};  ///< the first failing call's error, or cudaSuccess
  char const* failed_call{};       ///< its name ("cudaMallocFromPoolAsync"...), or nullptr
  std::int64_t elapsed_ns{};       ///< steady-clock nanoseconds of the loop (when no error)
};

/**
 * @brief `pairs` rounds of `cudaMallocFromPoolAsync` + `cudaFreeAsync` of `bytes` bytes on
 * `pool` and `stream`, and nothing else, timed with the steady clock.
 *
 * Stops at the first failing call and reports it; a block allocated before a failed free
 * stays allocated (the caller is measuring, not recovering).
 */
inline raw_pairs_result raw_pool_pairs(cudaMemPool_t pool,
                                       cudaStream_t stream,
                                       std::size_t bytes,
                                       std::int64_t pairs) noexcept
{
  raw_pairs_result out{};
  auto const t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < pairs; ++i) {
    void* ptr = nullptr;
    if (auto const e = cudaMallocFromPoolAsync(&ptr, bytes, pool, stream); e != cudaSuccess) {
      out.error       = e;
      out.failed_call = "cudaMallocFromPoolAsync";
      return out;
    }
    if (auto const e = cudaFreeAsync(ptr, stream); e != cudaSuccess) {
      out.error       = e;
      out.failed_call = "cudaFreeAsync";
      return out;
    }
  }
  out.elapsed_ns =
    std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
  return out;
}

/// Whether this translation unit was compiled with optimization: a floor measured from an
/// -O0 build times the compiler, not the driver, and the Python benchmark refuses it.
#ifdef __OPTIMIZE__
inline constexpr bool built_optimized = true;
#else
inline constexpr bool built_optimized = false;
#endif

}  // namespace asyncmr_bench
