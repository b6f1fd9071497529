/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The driver calls are written here by hand rather than through CCCL's cuda::*_memory_pool
// (bundled with librmm, CCCL 3.5): CCCL's default-pool getters raise a zero release threshold
// unconditionally (asyncmr must be able to apply 0 exactly), its pinned pools grant access to
// every device (asyncmr lets the user choose), it has no CUDA 12.6-12.8 path, and it makes
// attribute calls outside relaxed capture mode, which invalidates a capture in progress.

#include "detail/driver_api.hpp"
#include "detail/pool_state.hpp"

#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>

#include <cstdint>
#include <mutex>
#include <string>

namespace asyncmr::detail {

void* driver_entry_point(char const* symbol, int version) noexcept
{
  void* address                          = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  auto const status =
    cudaGetDriverEntryPointByVersion(symbol, &address, version, cudaEnableDefault, &result);
  clear_own_error(status);
  return (status == cudaSuccess && result == cudaDriverEntryPointSuccess) ? address : nullptr;
}

int pointer_attribute(void* value, int attribute, void const* ptr) noexcept
{
  using get_fn    = int (*)(void*, int, unsigned long long);
  static auto get = reinterpret_cast<get_fn>(driver_entry_point("cuPointerGetAttribute", 4000));
  if (get == nullptr) { return -1; }
  auto const address = static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(ptr));
  return get(value, attribute, address);
}

void exchange_capture_mode(cudaStreamCaptureMode* mode) noexcept
{
  using exchange_fn    = int (*)(cudaStreamCaptureMode*);  // CUstreamCaptureMode: same values
  static auto exchange = reinterpret_cast<exchange_fn>(
    driver_entry_point("cuThreadExchangeStreamCaptureMode", 10010));
  if (exchange != nullptr) {
    cudaStreamCaptureMode const asked = *mode;
    if (exchange(mode) == 0) { return; }
    *mode = asked;  // refused: the runtime is asked the same
  }
  clear_own_error(cudaThreadExchangeStreamCaptureMode(mode));
}

namespace {

// ---- CUDA 13 driver functions a CUDA 12 runtime does not have ----------------------------------
//
// cuMemGetDefaultMemPool, cuMemGetMemPool, cuMemSetMemPool (CUDA 13.0) and cuMemPoolCreate with
// the managed allocation type, reached with cudaGetDriverEntryPointByVersion (CUDA 12.5+). The
// driver's types are spelled with the runtime's, which have the same layout (CUmemoryPool is
// cudaMemPool_t, CUmemLocation is cudaMemLocation, CUmemPoolProps is cudaMemPoolProps), and a
// CUresult with the numeric value of the cudaError_t that means the same (CUDA keeps them
// equal for the errors these calls return).
using get_pool_fn    = int (*)(cudaMemPool_t*, cudaMemLocation*, int);
using set_pool_fn    = int (*)(cudaMemLocation*, int, cudaMemPool_t);
using create_pool_fn = int (*)(cudaMemPool_t*, cudaMemPoolProps const*);

struct cuda13_driver_functions {
  get_pool_fn get_default{nullptr};
  get_pool_fn get_current{nullptr};
  set_pool_fn set_current{nullptr};
  create_pool_fn create{nullptr};
  std::string missing{};  // why they could not all be found
};

template <class Fn>
void find(char const* symbol, Fn& fn, std::string& missing)
{
  if (void* const address = driver_entry_point(symbol, 13000)) {
    fn = reinterpret_cast<Fn>(address);
    return;
  }
  if (!missing.empty()) { missing += ", "; }
  missing += symbol;
}

cuda13_driver_functions const& cuda13()
{
  static cuda13_driver_functions const functions = [] {
    cuda13_driver_functions f;
    find("cuMemGetDefaultMemPool", f.get_default, f.missing);
    find("cuMemGetMemPool", f.get_current, f.missing);
    find("cuMemSetMemPool", f.set_current, f.missing);
    find("cuMemPoolCreate", f.create, f.missing);
    return f;
  }();
  if (!functions.missing.empty()) {
    throw unsupported_error{"asyncmr: the CUDA driver (" + version_string(versions().driver) +
                            ") has no CUDA 13 entry point for " + functions.missing +
                            "; managed pools and default/current host pools need a 13.x driver"};
  }
  return functions;
}

void driver_try(int result, char const* call)
{
  if (result != 0) { throw_cuda_error(static_cast<cudaError_t>(result), call); }
}

#if CUDART_VERSION < 13000
// A CUDA 12 runtime reaches pools by location for devices only; the decision in capability.cpp
// never sends other kinds here, and this keeps a wrong path from touching the wrong pool.
void only_device_pools_by_runtime(allocation_type type)
{
  if (type != allocation_type::device) {
    throw unsupported_error{std::string{"asyncmr: a CUDA 12 runtime has no "} + to_string(type) +
                            " pools by location"};
  }
}
#endif

// The driver's CUmemAllocationType: device and pinned memory are both "pinned".
int driver_type(allocation_type type) { return type == allocation_type::managed ? 2 : 1; }

}  // namespace

cudaMemPool_t get_default_pool(location const& where, allocation_type type, pool_path path)
{
  cudaMemPool_t handle = nullptr;
  cudaMemLocation loc  = where.to_cuda();
  switch (path) {
    case pool_path::stand_in: return stand_in_pool(where, type);
    case pool_path::driver_entry_point:
      driver_try(cuda13().get_default(&handle, &loc, driver_type(type)),
                 "cuMemGetDefaultMemPool (driver entry point)");
      return handle;
    case pool_path::runtime: break;
  }
#if CUDART_VERSION >= 13000
  ASYNCMR_CUDA_TRY(cudaMemGetDefaultMemPool(&handle, &loc, to_cuda(type)));
#else
  only_device_pools_by_runtime(type);
  ASYNCMR_CUDA_TRY(cudaDeviceGetDefaultMemPool(&handle, where.id));
#endif
  return handle;
}

cudaMemPool_t get_current_pool(location const& where, allocation_type type, pool_path path)
{
  cudaMemPool_t handle = nullptr;
  cudaMemLocation loc  = where.to_cuda();
  switch (path) {
    case pool_path::stand_in: return stand_in_pool(where, type);
    case pool_path::driver_entry_point:
      driver_try(cuda13().get_current(&handle, &loc, driver_type(type)),
                 "cuMemGetMemPool (driver entry point)");
      return handle;
    case pool_path::runtime: break;
  }
#if CUDART_VERSION >= 13000
  ASYNCMR_CUDA_TRY(cudaMemGetMemPool(&handle, &loc, to_cuda(type)));
#else
  only_device_pools_by_runtime(type);
  ASYNCMR_CUDA_TRY(cudaDeviceGetMemPool(&handle, where.id));
#endif
  return handle;
}

void set_current_pool(location const& where,
                      allocation_type type,
                      cudaMemPool_t handle,
                      pool_path path)
{
  cudaMemLocation loc = where.to_cuda();
  if (path == pool_path::driver_entry_point) {
    driver_try(cuda13().set_current(&loc, driver_type(type), handle),
               "cuMemSetMemPool (driver entry point)");
    return;
  }
#if CUDART_VERSION >= 13000
  ASYNCMR_CUDA_TRY(cudaMemSetMemPool(&loc, to_cuda(type), handle));
#else
  only_device_pools_by_runtime(type);
  ASYNCMR_CUDA_TRY(cudaDeviceSetMemPool(where.id, handle));
#endif
}

cudaError_t create_pool(cudaMemPool_t* handle, cudaMemPoolProps const& props, pool_path path)
{
  if (path == pool_path::driver_entry_point) {
    return static_cast<cudaError_t>(cuda13().create(handle, &props));
  }
  auto props_copy = props;  // the runtime takes a non-const pointer in older headers
  return cudaMemPoolCreate(handle, &props_copy);
}

}  // namespace asyncmr::detail
