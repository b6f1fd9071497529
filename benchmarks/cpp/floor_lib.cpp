/*
 * SPDX-License-Identifier: Apache-2.0
 */

/**
 * @file floor_lib.cpp
 * @brief `libasyncmr_floor.so`: the raw floor as a C entry point, for the Python benchmark to
 * load with ctypes and time in the same interleaved rounds as the Python resources.
 *
 * It links its own (static) CUDA runtime. Pool handles and streams are driver objects, so a
 * handle from asyncmr's runtime and a stream from RMM's work here; both must belong to the
 * primary context of `device`.
 */

#include "raw_pool_pairs.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#define ASYNCMR_FLOOR_API extern "C" __attribute__((visibility("default")))

/**
 * @brief Times `pairs` alloc+free pairs of `bytes` bytes on `pool` and `stream`.
 *
 * @param device       the device whose primary context owns `pool` and `stream`
 * @param pool         a `cudaMemPool_t`
 * @param stream       a `cudaStream_t`
 * @param bytes        bytes per allocation
 * @param pairs        number of pairs, > 0
 * @param elapsed_ns   out: steady-clock nanoseconds of the loop
 * @param failed_call  out (may be null): the name of the call that failed, or null
 * @return a `cudaError_t` value: 0 (cudaSuccess) when the loop ran
 */
ASYNCMR_FLOOR_API int asyncmr_floor_pairs(int device,
                                          void* pool,
                                          void* stream,
                                          std::size_t bytes,
                                          std::int64_t pairs,
                                          std::int64_t* elapsed_ns,
                                          char const** failed_call)
{
  if (failed_call != nullptr) { *failed_call = nullptr; }
  if (elapsed_ns == nullptr || pool == nullptr || pairs <= 0) { return cudaErrorInvalidValue; }
  if (auto const e = cudaSetDevice(device); e != cudaSuccess) {
    if (failed_call != nullptr) { *failed_call = "cudaSetDevice"; }
    return e;
  }
  auto const r = asyncmr_bench::raw_pool_pairs(
    static_cast<cudaMemPool_t>(pool), static_cast<cudaStream_t>(stream), bytes, pairs);
  if (r.error != cudaSuccess) {
    // Clear this runtime's record of the error so the next call starts clean.
    cudaGetLastError();
    if (failed_call != nullptr) { *failed_call = r.failed_call; }
    return r.error;
  }
  *elapsed_ns = r.elapsed_ns;
  return cudaSuccess;
}

/// 1 when the library was compiled with optimization, else 0.
ASYNCMR_FLOOR_API int asyncmr_floor_optimized() { return asyncmr_bench::built_optimized ? 1 : 0; }

/// The name of a `cudaError_t` value ("cudaErrorMemoryAllocation"...).
ASYNCMR_FLOOR_API char const* asyncmr_floor_error_name(int error)
{
  return cudaGetErrorName(static_cast<cudaError_t>(error));
}
