/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file capability.hpp
 * @brief The one place that answers "does this driver / runtime / device support X".
 */

#include <asyncmr/location.hpp>

#include <string>

namespace asyncmr {

/// @brief CUDA versions as the runtime reports them (e.g. 13000 for 13.0, 13020 for 13.2).
struct cuda_versions {
  int driver;   ///< `cudaDriverGetVersion`; 0 when no driver is installed
  int runtime;  ///< `cudaRuntimeGetVersion` (the runtime asyncmr was built with)
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
 * @brief Throws `unsupported_error` naming the missing capability unless pools of `type` at
 * `loc` can exist on this build, driver and device (`device` is the device the check is made
 * for; host locations are checked against it too).
 */
void require_pool_support(location const& loc, allocation_type type, int device);

/// @brief The current device of the calling thread (after `require_cuda`).
[[nodiscard]] int current_device();

}  // namespace asyncmr
