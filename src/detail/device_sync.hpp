/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: making a used device's context current for the runtime calls that need one,
// without touching the devices the process never used. (No device-wide synchronization: one
// refuses, and invalidates, every capture running on the device.)

#include <cuda_runtime_api.h>

#include <optional>

namespace asyncmr::detail {

/**
 * Makes the primary context of `device` current on the calling thread for the scope, if that
 * context is active; else the first device with an active one; else nothing changes. The
 * thread's previous context is current again afterwards. For runtime calls that act on the
 * current device (`cudaStreamPerThread`) from threads that may never have chosen one.
 */
class active_context_scope {
 public:
  explicit active_context_scope(std::optional<int> device) noexcept;
  ~active_context_scope();
  active_context_scope(active_context_scope const&)            = delete;
  active_context_scope& operator=(active_context_scope const&) = delete;

 private:
  int retained_{-1};  // the device whose primary context this scope retained and pushed
};

}  // namespace asyncmr::detail
