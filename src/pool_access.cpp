/*
 * SPDX-License-Identifier: Apache-2.0
 */

// Which devices reach a pool's memory: mem_pool::set_access and mem_pool::access, with what
// the driver would answer badly judged first (docs/DRIVER_FACTS.md, "Access").

#include "detail/pool_state.hpp"

#include <asyncmr/capability.hpp>
#include <asyncmr/detail/blocking.hpp>
#include <asyncmr/detail/capture_mode.hpp>
#include <asyncmr/error.hpp>
#include <asyncmr/mem_pool.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace asyncmr {

void mem_pool::set_access(std::vector<int> const& devices, access_mode mode) const
{
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
  detail::relaxed_capture_guard guard;
  // Judged before the driver is asked, which answers a device pool's own device given less than
  // read-write with cudaErrorInvalidDevice and takes the last of a device named twice. (A
  // managed pool's own device reads "none" until granted, and its memory serves that device
  // all the same: the driver judges those.)
  for (int const d : devices) { detail::check_device_ordinal(d, "set_access: device"); }
  require_distinct_devices(devices, "set_access: devices");
  std::optional<asyncmr::location> const home = location();
  bool const on_a_device = home && home->kind == location_kind::device &&
                           type() == std::optional{allocation_type::device};
  std::vector<cudaMemAccessDesc> descs;
  descs.reserve(devices.size());
  for (int const device : devices) {
    require_device(device);
    if (on_a_device && home->id == device && mode != access_mode::read_write) {
      throw std::invalid_argument{
        "asyncmr: set_access: device " + std::to_string(device) + " holds this pool's memory "
        "and always has read-write access to it (asked: " +
        (mode == access_mode::read ? "r" : "none") + "); name the other devices"};
    }
    cudaMemAccessDesc d{};
    d.location = asyncmr::location::device(device).to_cuda();
    d.flags    = mode == access_mode::read_write ? cudaMemAccessFlagsProtReadWrite
                 : mode == access_mode::read     ? cudaMemAccessFlagsProtRead
                                                 : cudaMemAccessFlagsProtNone;
    descs.push_back(d);
  }
  if (descs.empty()) { return; }
  detail::blocking_region wait;  // the driver may wait for the device to change the mappings
  cudaError_t const status = cudaMemPoolSetAccess(h, descs.data(), descs.size());
  if (status == cudaErrorNotSupported && mode == access_mode::read) {
    detail::clear_own_error(status);
    throw unsupported_error{"asyncmr: set_access: this driver does not support read-only access "
                            "to pool memory (cudaMemPoolSetAccess: cudaErrorNotSupported); "
                            "grant \"rw\" or \"none\""};
  }
  ASYNCMR_CUDA_TRY(status);
}

access_mode mem_pool::access(int device) const
{
  detail::check_device_ordinal(device, "access: device");
  detail::pool_use const use{*state_};
  cudaMemPool_t const h = use.handle();
  detail::relaxed_capture_guard guard;
  require_device(device);
  cudaMemLocation loc      = asyncmr::location::device(device).to_cuda();
  cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
  ASYNCMR_CUDA_TRY(cudaMemPoolGetAccess(&flags, h, &loc));
  switch (flags) {
    case cudaMemAccessFlagsProtReadWrite: return access_mode::read_write;
    case cudaMemAccessFlagsProtRead: return access_mode::read;
    default: return access_mode::none;
  }
}

}  // namespace asyncmr
