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

/**
 * Makes the context of `stream` current on the calling thread for the scope (pushed, then
 * popped: the thread's own context, primary or not, or none, is current again afterwards), for
 * runtime calls that must make an object in the stream's context. `ok()` is false when the
 * driver cannot name that context; nothing changed then.
 */
class stream_context_scope {
 public:
  explicit stream_context_scope(cudaStream_t stream) noexcept;
  ~stream_context_scope();
  stream_context_scope(stream_context_scope const&)            = delete;
  stream_context_scope& operator=(stream_context_scope const&) = delete;
  [[nodiscard]] bool ok() const noexcept { return ok_; }

 private:
  bool ok_{false};
  bool pushed_{false};
};

}  // namespace asyncmr::detail
