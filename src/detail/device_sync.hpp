/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: waiting for devices without touching the ones the process never used, and
// making a used device's context current for the runtime calls that need one.

#include <cuda_runtime_api.h>

#include <optional>

namespace asyncmr::detail {

/**
 * Waits until every device whose primary context is active has finished all the work queued
 * on it, in a blocking region and in relaxed capture mode. Devices without an active primary
 * context are left alone: no context is created on them (their primary context being inactive
 * means no stream of this process's runtime can be using them). Success when every active device
 * answered success; an error when one refused or the driver could not be asked (then nothing can
 * be assumed finished). Returns the first error (the driver's code, which has the runtime's
 * value for the errors a synchronization returns), or cudaErrorNotSupported when the driver
 * lacks the entry points.
 */
[[nodiscard]] cudaError_t synchronize_active_devices() noexcept;

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
