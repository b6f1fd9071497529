/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file capability.hpp
 * @brief The one place that answers "does this build, driver and device support X", and how
 * asyncmr reaches each kind of pool.
 *
 * The decision itself (`decide_pool_support`, `decide_routing_support`) is a pure function of
 * a `platform` value, so every combination of build, driver and device can be checked without
 * a GPU; `current_platform` fills that value from the running system.
 */

#include <asyncmr/location.hpp>

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
#include <vector>

namespace asyncmr {

/// @brief CUDA versions as the runtime reports them (e.g. 13000 for 13.0, 12090 for 12.9).
struct cuda_versions {
  int driver;   ///< `cudaDriverGetVersion` (or the testing override); 0 when there is no driver
  int runtime;  ///< the CUDA runtime asyncmr was built with (`CUDART_VERSION` of the build)
};

/// @brief The driver and runtime versions. Never throws; a missing driver reports 0.
[[nodiscard]] cuda_versions versions() noexcept;

/// @brief "13.0" for 13000.
[[nodiscard]] std::string version_string(int version);

/**
 * @brief Throws `no_device_error` with a message that says what is missing (driver, device, a
 * driver new enough for this build) unless CUDA is usable; returns the device count otherwise.
 */
int require_cuda();

/**
 * @brief Throws `std::out_of_range` unless `device` is a visible device ordinal (and
 * `no_device_error` when CUDA is unusable).
 */
void require_device(int device);

/**
 * @brief Throws `std::invalid_argument` ("asyncmr: <what>: device N is named twice") if a device
 * appears twice in `devices`; asks no driver.
 */
void require_distinct_devices(std::vector<int> const& devices, char const* what);

/// @brief The current device of the calling thread (after `require_cuda`).
[[nodiscard]] int current_device();

/// @brief What one device offers that decides which pools it can have.
struct device_facts {
  bool memory_pools{false};               ///< `cudaDevAttrMemoryPoolsSupported`
  bool concurrent_managed_access{false};  ///< `cudaDevAttrConcurrentManagedAccess`
  bool host_memory_pools{false};          ///< `cudaDevAttrHostMemoryPoolsSupported` (144)
  bool host_numa_memory_pools{false};     ///< `cudaDevAttrHostNumaMemoryPoolsSupported` (142)
};

/// @brief Everything a support decision depends on.
struct platform {
  int driver{0};              ///< driver version, `cudaDriverGetVersion` units
  int build{CUDART_VERSION};  ///< the CUDA runtime asyncmr was compiled against
  device_facts device{};      ///< the device the pool is for (host pools: the current device)
};

/// @brief How asyncmr reaches a pool.
enum class pool_path : int {
  runtime,             ///< through the CUDA runtime asyncmr links
  driver_entry_point,  ///< through a CUDA 13 driver function the build's runtime lacks
  stand_in,            ///< asyncmr's own process-wide pool, standing in for a default pool
};

/// @brief "runtime", "driver_entry_point" or "stand_in".
[[nodiscard]] char const* to_string(pool_path path) noexcept;

/// @brief A support decision: the path to the pool, or why there is none.
struct support {
  std::optional<pool_path> path{};  ///< set when supported
  std::string reason{};             ///< why not, when unsupported (a whole sentence)

  [[nodiscard]] explicit operator bool() const noexcept { return path.has_value(); }
};

/**
 * @brief Whether a `source` pool of `type` at `where` can be had on `p`, and how.
 *
 * - Device pools: always through the runtime (CUDA 12 and 13 builds alike).
 * - Host (pinned) pools need a 12.6+ driver. Creating one is a runtime call; the default and
 *   current ones are CUDA 13 runtime calls, reached in a CUDA 12 build through the driver's
 *   entry points on a 13.x driver. On a 12.x driver a CUDA 12 build serves `default_pool` with
 *   asyncmr's own process-wide stand-in pool and has no `current` pool.
 * - Managed pools are a CUDA 13 driver feature (a CUDA 12 build reaches them through the
 *   driver's entry points) and need concurrent managed access.
 *
 * Impossible combinations (device memory on the host, ...) are `validate_combination`'s
 * concern, not this function's. Pure: no CUDA call.
 */
[[nodiscard]] support decide_pool_support(platform const& p,
                                          location const& where,
                                          allocation_type type,
                                          pool_source source);

/// @brief Whether the current pool of `type` can be changed (`make_current`) on `p`, and how.
[[nodiscard]] support decide_routing_support(platform const& p, allocation_type type);

/// @brief The platform of `device` as the running system reports it (device facts are cached).
[[nodiscard]] platform current_platform(int device);

/**
 * @brief Throws `unsupported_error` with the reason unless `decide_pool_support` allows the pool
 * on `device`'s platform; returns the path otherwise.
 */
pool_path require_pool_support(location const& where,
                               allocation_type type,
                               pool_source source,
                               int device);

namespace testing {
/**
 * @brief Makes asyncmr act as if the driver were `version` (0 restores the real one), for
 * tests of the decisions above on real hardware. Also read once from the environment variable
 * `ASYNCMR_TESTING_DRIVER_VERSION`. Not for production: a version the driver does not have
 * only makes asyncmr ask for things the driver then refuses.
 */
void set_driver_version(int version) noexcept;
}  // namespace testing

}  // namespace asyncmr
