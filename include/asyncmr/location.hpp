/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file location.hpp
 * @brief The vocabulary of pools: where a pool's memory lives, what kind of memory it hands
 * out, and which pool of a location a resource takes.
 */

#include <cuda_runtime_api.h>

#include <string>

namespace asyncmr {

/// @brief The kind of a memory location (mirrors `cudaMemLocationType`).
enum class location_kind : int {
  none,               ///< no preferred location (managed pools only)
  device,             ///< a device; `id` is its ordinal
  host,               ///< host memory, any NUMA node
  host_numa,          ///< host memory on NUMA node `id`
  host_numa_current,  ///< host memory on the NUMA node closest to the calling thread
};

/// @brief A memory location: a kind and, for devices and NUMA nodes, an id.
struct location {
  location_kind kind{location_kind::none};
  int id{0};

  [[nodiscard]] static constexpr location device(int ordinal) noexcept
  {
    return {location_kind::device, ordinal};
  }
  [[nodiscard]] static constexpr location host() noexcept { return {location_kind::host, 0}; }
  [[nodiscard]] static constexpr location host_numa(int node) noexcept
  {
    return {location_kind::host_numa, node};
  }
  [[nodiscard]] static constexpr location host_numa_current() noexcept
  {
    return {location_kind::host_numa_current, 0};
  }
  [[nodiscard]] static constexpr location none() noexcept { return {location_kind::none, 0}; }

  /// @brief True for the host kinds (host, host_numa, host_numa_current).
  [[nodiscard]] constexpr bool is_host() const noexcept
  {
    return kind == location_kind::host || kind == location_kind::host_numa ||
           kind == location_kind::host_numa_current;
  }

  [[nodiscard]] constexpr bool operator==(location const& other) const noexcept
  {
    // The id means nothing for host, host_numa_current and none.
    bool const id_matters = kind == location_kind::device || kind == location_kind::host_numa;
    return kind == other.kind && (!id_matters || id == other.id);
  }

  /// @brief The driver's spelling of this location.
  [[nodiscard]] cudaMemLocation to_cuda() const noexcept;
  /// @brief The location a driver value describes.
  [[nodiscard]] static location from_cuda(cudaMemLocation const& loc) noexcept;
  /// @brief "device(0)", "host", "host_numa(1)", ...
  [[nodiscard]] std::string to_string() const;
};

/**
 * @brief What a pool hands out.
 *
 * `device` and `pinned` are both `cudaMemAllocationTypePinned` to the driver; they differ by
 * location (a device, or the host). `managed` is `cudaMemAllocationTypeManaged` (CUDA 13).
 */
enum class allocation_type : int { device, pinned, managed };

/// @brief "device", "pinned" or "managed".
[[nodiscard]] char const* to_string(allocation_type type) noexcept;

/// @brief Which pool of a location and allocation type a resource takes.
enum class pool_source : int {
  default_pool,  ///< the default pool of the location and type (shared, process-wide)
  current,       ///< the current pool of the location and type (shared, process-wide)
  new_pool,      ///< a new pool made for, and destroyed with, the resource (Python: "new")
};

/// @brief "default", "current" or "new" (the Python spelling).
[[nodiscard]] char const* to_string(pool_source source) noexcept;

/**
 * @brief Throws `std::invalid_argument` if the driver is known to refuse `type` at `loc`
 * (device memory off a device, pinned memory on a device or nowhere). `for_create` adds the
 * combinations only pool creation refuses (host_numa_current).
 */
void validate_combination(location const& loc, allocation_type type, bool for_create);

namespace detail {
/// @brief The driver's allocation type for `type`.
[[nodiscard]] cudaMemAllocationType to_cuda(allocation_type type);
/**
 * @brief Throws `std::invalid_argument` naming `what` and the host's nodes unless the host has
 * NUMA node `node`, as Linux lists them (/sys/devices/system/node/node<N>; a kernel without NUMA
 * support lists none and has node 0 only). No driver call: the driver would refuse a node the
 * host lacks with cudaErrorInvalidValue, which says nothing of the node. Elsewhere than Linux
 * every node >= 0 passes, for the driver to judge.
 */
void check_host_numa_node(int node, char const* what);
/// @brief Throws `std::invalid_argument` "asyncmr: <what> must be in [0, 2**31), got <device>"
/// for a negative device ordinal (the range an `int` ordinal has, in the words Python's callers
/// read too). No driver call: whether the device exists is `require_device`'s.
void check_device_ordinal(int device, char const* what);
}  // namespace detail

}  // namespace asyncmr
