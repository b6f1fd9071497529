/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <cuda_runtime_api.h>

namespace asyncmr::detail {

/// `cuThreadExchangeStreamCaptureMode` through the driver's entry point (the pools' allocations
/// and frees pay for two of these each, and through the runtime each costs as much as a driver
/// call and the runtime's own checks), or `cudaThreadExchangeStreamCaptureMode` when the driver
/// has no such entry point or refuses. The modes are the same numbers in both APIs.
void exchange_capture_mode(cudaStreamCaptureMode* mode) noexcept;

/**
 * @brief Puts the calling thread in relaxed stream-capture mode for its lifetime.
 *
 * Pool attribute, trim, access and routing calls are "unsafe" in the capture sense: while any
 * stream captures in global mode (or this thread captures in thread-local mode) the driver
 * refuses them AND invalidates the capture. In relaxed mode the same calls succeed and the
 * capture stays valid (docs/DRIVER_FACTS.md). Every call in asyncmr that touches a pool runs
 * under one of these guards, allocations and frees included (beside another thread's global
 * capture the driver refuses a new pool's first allocation otherwise: docs/DRIVER_FACTS.md).
 */
class relaxed_capture_guard {
 public:
  relaxed_capture_guard() noexcept
  {
    // Cannot fail for a valid enum value; the previous mode comes back through `mode_`.
    exchange_capture_mode(&mode_);
  }
  ~relaxed_capture_guard() noexcept { exchange_capture_mode(&mode_); }

  relaxed_capture_guard(relaxed_capture_guard const&)            = delete;
  relaxed_capture_guard& operator=(relaxed_capture_guard const&) = delete;
  relaxed_capture_guard(relaxed_capture_guard&&)                 = delete;
  relaxed_capture_guard& operator=(relaxed_capture_guard&&)      = delete;

 private:
  cudaStreamCaptureMode mode_{cudaStreamCaptureModeRelaxed};
};

}  // namespace asyncmr::detail
