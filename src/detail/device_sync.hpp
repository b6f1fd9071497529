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

/// The context current on the calling thread, or nullptr (none, or the driver cannot say).
[[nodiscard]] void* current_context() noexcept;
/// The context `stream` belongs to (the current one for the special handles), or nullptr.
[[nodiscard]] void* stream_context(cudaStream_t stream) noexcept;

/// Whether `context` is a device's primary context (the runtime's, which lives until the
/// process ends or the device is reset), not one a caller made (cuCtxCreate) and may destroy.
/// Makes no context; asks the driver about each visible device whose primary context is active.
[[nodiscard]] bool primary_context(void* context) noexcept;

/**
 * Makes `context` current on the calling thread for the scope (pushed, then popped: the
 * thread's own context, primary or not, or none, is current again afterwards), for runtime
 * calls that must act in that context. `ok()` is false for a null context or when the driver
 * refuses; nothing changed then.
 */
class context_scope {
 public:
  explicit context_scope(void* context) noexcept;
  ~context_scope();
  context_scope(context_scope const&)            = delete;
  context_scope& operator=(context_scope const&) = delete;
  [[nodiscard]] bool ok() const noexcept { return ok_; }

 private:
  bool ok_{false};
  bool pushed_{false};
};

/**
 * Makes the primary context of `device` current on the calling thread for the scope, retaining
 * it (which activates it, as cudaSetDevice would: for a device the caller named), and makes the
 * thread's own context, or none, current again afterwards. A cudaSetDevice round trip instead
 * makes the "previous" device's primary context when the thread had none, and replaces a
 * non-primary context with a primary one.
 * @throws cuda_error when the driver refuses
 */
class primary_context_scope {
 public:
  explicit primary_context_scope(int device);
  ~primary_context_scope();
  primary_context_scope(primary_context_scope const&)            = delete;
  primary_context_scope& operator=(primary_context_scope const&) = delete;

 private:
  int retained_{-1};  // the device whose primary context this scope retained and pushed
};

/**
 * A non-blocking stream of the current context for one job, nobody's capture, destroyed with
 * the scope (in a blocking region: destroying it may wait for its work).
 * @throws cuda_error when it cannot be made
 */
class scratch_stream {
 public:
  scratch_stream();
  ~scratch_stream();
  scratch_stream(scratch_stream const&)            = delete;
  scratch_stream& operator=(scratch_stream const&) = delete;
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }

 private:
  cudaStream_t stream_{nullptr};
};

}  // namespace asyncmr::detail
