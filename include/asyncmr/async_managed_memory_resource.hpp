/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <asyncmr/pool_resource.hpp>

#include <cuda/memory_resource>


namespace asyncmr {

/**
 * @brief Stream-ordered managed (unified) memory from a CUDA 13 managed memory pool.
 *
 * Memory is usable from the host and from every device that supports concurrent managed
 * access. Host code may touch a block only after the allocating stream reached the allocation.
 */
class async_managed_memory_resource final : public pool_resource {
 public:
  /**
   * @brief Obtains the pool `options` name (default: the device's default managed pool).
   *
   * Process-wide effect: if the pool is shared (default or current) and its release threshold
   * is 0, it is raised to the maximum so the pool keeps memory across synchronizations; a
   * non-zero threshold set by someone else is kept. An explicit `release_threshold` (0 too) is
   * applied exactly. Owned pools get `release_threshold`, else the maximum. Host-located pools
   * get read-write access for `accessible_from` (every visible device by default).
   *
   * @throws unsupported_error on a driver older than 13.0 (a CUDA 12 build reaches a 13.x
   * driver's managed pools through its entry points), or on devices without concurrent managed
   * access; `no_device_error` without a usable CUDA device.
   */
  explicit async_managed_memory_resource(resource_options const& options = {});
  /// @brief Allocates from `pool` (adopted, never destroyed by the resource unless it owns it).
  explicit async_managed_memory_resource(mem_pool pool, resource_options const& options = {});

  /// @brief The device the resource was made for.
  [[nodiscard]] int device() const noexcept { return resource_device().value_or(0); }

  [[nodiscard]] bool operator==(async_managed_memory_resource const& other) const noexcept
  {
    return same_pool(other);
  }

  friend void get_property(async_managed_memory_resource const&,
                           cuda::mr::device_accessible) noexcept
  {
  }
  friend void get_property(async_managed_memory_resource const&, cuda::mr::host_accessible) noexcept
  {
  }
};

static_assert(cuda::mr::resource<async_managed_memory_resource>);
static_assert(cuda::mr::synchronous_resource<async_managed_memory_resource>);
static_assert(cuda::mr::resource_with<async_managed_memory_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<async_managed_memory_resource, cuda::mr::host_accessible>);

}  // namespace asyncmr
