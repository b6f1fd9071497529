/*
 * SPDX-License-Identifier: Apache-2.0
 */

// A used device's context made current, asked of the driver through its entry points so that a
// device this process never used keeps having no context (cudaSetDevice initializes one, and
// every Dask-CUDA worker sees every GPU), and the blocking hooks every wait goes through.

#include "detail/device_sync.hpp"
#include "detail/driver_api.hpp"

#include <asyncmr/detail/blocking.hpp>
#include <asyncmr/error.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <string>

namespace asyncmr::detail {

// ---- the blocking hooks ----------------------------------------------------------------------

namespace {
std::atomic<void* (*)() noexcept> hook_enter{nullptr};
std::atomic<void (*)(void*) noexcept> hook_leave{nullptr};
}  // namespace

void set_blocking_hooks(blocking_hooks hooks) noexcept
{
  hook_leave.store(hooks.leave, std::memory_order_release);
  hook_enter.store(hooks.enter, std::memory_order_release);
}

blocking_region::blocking_region() noexcept : leave_{nullptr}, token_{nullptr}
{
  auto* const enter = hook_enter.load(std::memory_order_acquire);
  if (enter != nullptr) {
    leave_ = hook_leave.load(std::memory_order_acquire);
    token_ = enter();
  }
}

blocking_region::~blocking_region()
{
  if (leave_ != nullptr) { leave_(token_); }
}

// ---- the driver's view of devices and contexts ---------------------------------------------

namespace {

// The driver's types, spelled as the runtime has them: CUdevice is an int, CUcontext an opaque
// pointer, CUresult an int with cudaSuccess's value 0.
using context_t = void*;
struct context_functions {
  int (*device_get)(int*, int)                       = nullptr;  // cuDeviceGet
  int (*primary_state)(int, unsigned int*, int*)     = nullptr;  // cuDevicePrimaryCtxGetState
  int (*primary_retain)(context_t*, int)             = nullptr;  // cuDevicePrimaryCtxRetain
  int (*primary_release)(int)                        = nullptr;  // cuDevicePrimaryCtxRelease_v2
  int (*push)(context_t)                             = nullptr;  // cuCtxPushCurrent_v2
  int (*pop)(context_t*)                             = nullptr;  // cuCtxPopCurrent_v2
  int (*get_current)(context_t*)                     = nullptr;  // cuCtxGetCurrent
  int (*stream_context)(cudaStream_t, context_t*)    = nullptr;  // cuStreamGetCtx
  [[nodiscard]] bool complete() const noexcept
  {
    return device_get && primary_state && primary_retain && primary_release && push && pop &&
           get_current;
  }
};

context_functions const& driver() noexcept
{
  static context_functions const fns = [] {
    context_functions f;
    auto find = [](char const* symbol, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        driver_entry_point(symbol, 12000));
    };
    find("cuDeviceGet", f.device_get);
    find("cuDevicePrimaryCtxGetState", f.primary_state);
    find("cuDevicePrimaryCtxRetain", f.primary_retain);
    find("cuDevicePrimaryCtxRelease", f.primary_release);
    find("cuCtxPushCurrent", f.push);
    find("cuCtxPopCurrent", f.pop);
    find("cuCtxGetCurrent", f.get_current);
    find("cuStreamGetCtx", f.stream_context);
    return f;
  }();
  return fns;
}

int visible_devices() noexcept
{
  int count         = 0;
  auto const status = cudaGetDeviceCount(&count);  // creates no context
  clear_own_error(status);
  return status == cudaSuccess ? count : 0;
}

bool primary_active(context_functions const& f, int ordinal, int& device) noexcept
{
  unsigned int flags = 0;
  int active         = 0;
  return f.device_get(&device, ordinal) == 0 && f.primary_state(device, &flags, &active) == 0 &&
         active != 0;
}

// Makes `ctx` current unless it is already; true when it is current now. `pushed` is set when
// this pushed it: the caller pops it.
bool make_current(context_functions const& f, context_t ctx, bool& pushed) noexcept
{
  context_t current = nullptr;
  if (f.get_current(&current) == 0 && current == ctx) { return true; }
  if (f.push(ctx) != 0) { return false; }
  pushed = true;
  return true;
}

// Retains `dev`'s primary context (which activates it) and makes it current; true when it is
// current now. `retained` becomes `dev` when this pushed it: leave_primary undoes that. Otherwise
// the retain is let go at once (nothing to undo).
bool enter_primary(context_functions const& f, int dev, int& retained) noexcept
{
  context_t ctx = nullptr;
  if (f.primary_retain(&ctx, dev) != 0) { return false; }
  bool pushed        = false;
  bool const current = make_current(f, ctx, pushed);
  if (pushed) {
    retained = dev;
  } else {
    f.primary_release(dev);
  }
  return current;
}

void leave_primary(context_functions const& f, int retained) noexcept
{
  if (retained < 0) { return; }
  context_t popped = nullptr;
  f.pop(&popped);
  f.primary_release(retained);
}

}  // namespace

active_context_scope::active_context_scope(std::optional<int> device) noexcept
{
  auto const& f = driver();
  if (!f.complete()) { return; }
  int const count = visible_devices();
  auto try_device = [&](int ordinal) {
    int dev = 0;
    return ordinal >= 0 && ordinal < count && primary_active(f, ordinal, dev) &&
           enter_primary(f, dev, retained_);
  };
  if (device && try_device(*device)) { return; }
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    if (try_device(ordinal)) { return; }
  }
}

active_context_scope::~active_context_scope() { leave_primary(driver(), retained_); }

void* current_context() noexcept
{
  auto const& f     = driver();
  context_t current = nullptr;
  if (f.get_current == nullptr || f.get_current(&current) != 0) { return nullptr; }
  return current;
}

void* stream_context(cudaStream_t stream) noexcept
{
  auto const& f = driver();
  context_t ctx = nullptr;
  if (f.stream_context == nullptr || f.stream_context(stream, &ctx) != 0) { return nullptr; }
  return ctx;
}

bool primary_context(void* context) noexcept
{
  auto const& f = driver();
  if (context == nullptr || !f.complete()) { return false; }
  // Compared with each visible device's primary context where it is active (an inactive one is
  // no stream's, and retaining it would make it): the retain only counts one more user of it.
  for (int ordinal = 0, n = visible_devices(); ordinal < n; ++ordinal) {
    int device = 0;
    if (!primary_active(f, ordinal, device)) { continue; }
    context_t primary = nullptr;
    if (f.primary_retain(&primary, device) != 0) { continue; }
    static_cast<void>(f.primary_release(device));
    if (primary == context) { return true; }
  }
  return false;
}

context_scope::context_scope(void* context) noexcept
{
  auto const& f = driver();
  ok_ = context != nullptr && f.complete() && make_current(f, context, pushed_);
}

context_scope::~context_scope()
{
  if (!pushed_) { return; }
  context_t popped = nullptr;
  driver().pop(&popped);
}

primary_context_scope::primary_context_scope(int device)
{
  auto const& f = driver();
  int dev       = 0;
  if (!f.complete() || f.device_get(&dev, device) != 0 || !enter_primary(f, dev, retained_)) {
    throw cuda_error{cudaErrorInvalidDevice,
                     "asyncmr: device " + std::to_string(device) + "'s primary context could not "
                     "be made current (cuDevicePrimaryCtxRetain / cuCtxPushCurrent refused)"};
  }
}

primary_context_scope::~primary_context_scope() { leave_primary(driver(), retained_); }

scratch_stream::scratch_stream()
{
  ASYNCMR_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

scratch_stream::~scratch_stream()
{
  blocking_region const wait;  // destroying it may wait for its work
  clear_own_error(cudaStreamDestroy(stream_));
}

}  // namespace asyncmr::detail
