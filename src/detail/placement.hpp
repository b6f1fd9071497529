/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: what the resources' prefetch option and the placement calls
// (asyncmr/placement.hpp) share.

#include <asyncmr/location.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>

namespace asyncmr::detail {

/// Throws std::invalid_argument naming `what` (the argument: "to", "prefetch") unless `to` is a
/// device of an ordinal >= 0 or the host, and a NUMA node the host has (no driver call).
void check_target_kind(location to, char const* what);

/// As check_target_kind, and a device must be a visible one (asks the driver), and the driver
/// must have the placement calls (require_placement_driver).
void check_prefetch_target(location to);

/// The CUDA 12 build's placement calls (cudaMemPrefetchAsync_v2, cudaMemAdvise_v2) are CUDA 12.2
/// driver functions.
inline constexpr int placement_driver = 12020;

/// Throws unsupported_error naming `what` and 12.2 when the CUDA 12 build runs on an older driver
/// (none on the CUDA 13 build, whose driver require_cuda checks; nothing without a driver).
void require_placement_driver(char const* what);

/// `cudaMemPrefetchAsync(ptr, bytes, to, 0, stream)` with this build's runtime's signature.
[[nodiscard]] cudaError_t prefetch_async(void const* ptr,
                                         std::size_t bytes,
                                         location to,
                                         cudaStream_t stream) noexcept;

/// `cudaMemDiscardAndPrefetchBatchAsync` of the one range to `to` on the CUDA 13 build (a plain
/// prefetch on the legacy default stream, which the batched call refuses);
/// `cudaErrorNotSupported` on the CUDA 12 build, which has no such call.
[[nodiscard]] cudaError_t discard_and_prefetch_async(void* ptr,
                                                     std::size_t bytes,
                                                     location to,
                                                     cudaStream_t stream) noexcept;

}  // namespace asyncmr::detail
