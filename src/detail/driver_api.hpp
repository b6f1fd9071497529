/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: the calls that obtain, create and route pools, each by the path
// `decide_pool_support` chose (the runtime asyncmr links, a CUDA 13 driver entry point, or
// asyncmr's stand-in pool). One function per operation; the path is the only switch.

#include <asyncmr/capability.hpp>
#include <asyncmr/location.hpp>

#include <cuda_runtime_api.h>

namespace asyncmr::detail {

/// The driver function `symbol` as of CUDA `version` (e.g. 13000), through
/// `cudaGetDriverEntryPointByVersion`; null when the driver does not have it. A refusal is
/// cleared from the runtime's error slot. Cast the result to the function's type.
[[nodiscard]] void* driver_entry_point(char const* symbol, int version) noexcept;

/// `cuPointerGetAttribute(value, attribute, ptr)` through the driver's entry point (the
/// CU_POINTER_ATTRIBUTE_* number as an int): the driver's answer, or -1 when this driver has no
/// such entry point. Makes no CUDA context.
[[nodiscard]] int pointer_attribute(void* value, int attribute, void const* ptr) noexcept;

/// The default pool of `type` at `where`.
[[nodiscard]] cudaMemPool_t get_default_pool(location const& where,
                                             allocation_type type,
                                             pool_path path);
/// The current pool of `type` at `where`.
[[nodiscard]] cudaMemPool_t get_current_pool(location const& where,
                                             allocation_type type,
                                             pool_path path);
/// Makes `handle` the current pool of `type` at `where`, process-wide.
void set_current_pool(location const& where,
                      allocation_type type,
                      cudaMemPool_t handle,
                      pool_path path);
/// A new pool; ownership to the caller. The driver's answer is returned, not thrown, so the
/// caller can say why it refused (a bounded managed pool, ...); a missing driver entry point
/// throws `unsupported_error`.
[[nodiscard]] cudaError_t create_pool(cudaMemPool_t* handle,
                                      cudaMemPoolProps const& props,
                                      pool_path path);

}  // namespace asyncmr::detail
