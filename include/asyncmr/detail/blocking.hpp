/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file blocking.hpp
 * @brief The one mechanism for calls that wait on the device: a scope that lets an embedding
 * runtime step aside while the calling thread waits.
 *
 * A wait on the device (a device or stream synchronization, a pool change the driver makes
 * wait) can depend on host work: a host function queued on a stream (`cudaLaunchHostFunc`)
 * runs on a driver thread and may need a lock the waiting thread holds. Python's is the GIL: a
 * Python host function waits for the GIL while the thread that holds it waits for the device,
 * forever. asyncmr's Python module installs hooks that release the GIL for the length of every
 * `blocking_region` (when the calling thread holds it), so no asyncmr call can deadlock that
 * way, whoever calls it: Python, RMM's C++ (`rmm::device_buffer`'s destructor), a destructor.
 * Without hooks a region does nothing.
 */

namespace asyncmr::detail {

/// @brief What an embedding runtime does around a wait: `enter` returns a token for `leave`.
struct blocking_hooks {
  void* (*enter)() noexcept      = nullptr;
  void (*leave)(void*) noexcept = nullptr;
};

/// @brief Installs the hooks every later `blocking_region` calls (both null: none).
void set_blocking_hooks(blocking_hooks hooks) noexcept;

/// @brief A scope around one wait on the device (see the file comment).
class blocking_region {
 public:
  blocking_region() noexcept;
  ~blocking_region();
  blocking_region(blocking_region const&)            = delete;
  blocking_region& operator=(blocking_region const&) = delete;
  blocking_region(blocking_region&&)                 = delete;
  blocking_region& operator=(blocking_region&&)      = delete;

 private:
  void (*leave_)(void*) noexcept;
  void* token_;
};

}  // namespace asyncmr::detail
