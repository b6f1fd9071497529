/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <asyncmr/pool_resource.hpp>

#include <cuda/memory_resource>


namespace asyncmr {

/**
 * @brief Stream-ordered device memory from a device memory pool, with the same pool control
 * as the managed and pinned resources.
 */
class async_device_memory_resource final : public pool_resource {
 public:
  /**
   * @brief Obtains the pool `options` name (default: the device's default pool, which
   * `cudaMallocAsync` uses too). Process-wide effect: the release threshold policy of
   * `async_managed_memory_resource`.
   */
  explicit async_device_memory_resource(resource_options const& options = {});
  /// @brief Allocates from `pool`, a device pool the caller made (not destroyed unless owned).
  explicit async_device_memory_resource(mem_pool pool, resource_options const& options = {});

  /// @brief The device the memory lives on.
  [[nodiscard]] int device() const noexcept { return resource_device().value_or(0); }

  [[nodiscard]] bool operator==(async_device_memory_resource const& other) const noexcept
  {
    return same_pool(other);
  }

  friend void get_property(async_device_memory_resource const&, cuda::mr::device_accessible) noexcept
  {
  }
};

static_assert(cuda::mr::resource<async_device_memory_resource>);
static_assert(cuda::mr::synchronous_resource<async_device_memory_resource>);
static_assert(cuda::mr::resource_with<async_device_memory_resource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::resource_with<async_device_memory_resource, cuda::mr::host_accessible>);

}  // namespace asyncmr
