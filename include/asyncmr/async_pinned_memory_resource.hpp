/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <asyncmr/pool_resource.hpp>

#include <cuda/memory_resource>


namespace asyncmr {

/**
 * @brief Stream-ordered pinned (page-locked) host memory from a host memory pool (CUDA 12.6+).
 *
 * Host pools start with no device access; this resource grants read-write access to
 * `accessible_from` (every visible device by default) so kernels can use the memory. Host code
 * may touch a block only after the allocating stream reached the allocation.
 */
class async_pinned_memory_resource final : public pool_resource {
 public:
  /**
   * @brief Obtains the pool `options` name (default: the default host pinned pool: CUDA 13's,
   * or, for a CUDA 12 build on a 12.x driver, asyncmr's process-wide stand-in; see
   * `decide_pool_support`).
   *
   * Process-wide effects on shared pools: access grants, and the release threshold policy of
   * `async_managed_memory_resource`.
   */
  explicit async_pinned_memory_resource(resource_options const& options = {});
  /// @brief Allocates from `pool`, a host pool the caller made (not destroyed unless owned).
  explicit async_pinned_memory_resource(mem_pool pool, resource_options const& options = {});

  [[nodiscard]] bool operator==(async_pinned_memory_resource const& other) const noexcept
  {
    return same_pool(other);
  }

  friend void get_property(async_pinned_memory_resource const&, cuda::mr::device_accessible) noexcept
  {
  }
  friend void get_property(async_pinned_memory_resource const&, cuda::mr::host_accessible) noexcept
  {
  }
};

static_assert(cuda::mr::resource<async_pinned_memory_resource>);
static_assert(cuda::mr::synchronous_resource<async_pinned_memory_resource>);
static_assert(cuda::mr::resource_with<async_pinned_memory_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<async_pinned_memory_resource, cuda::mr::host_accessible>);

}  // namespace asyncmr
