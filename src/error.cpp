/*
 * SPDX-License-Identifier: Apache-2.0
 */

// The one place a cudaError_t becomes an exception. It asks nothing of the capability probe
// (which may throw through here, never the other way round): what it says about a missing
// driver or device comes from the error alone.

#include <asyncmr/error.hpp>

#include <cstdlib>
#include <string>

namespace asyncmr::detail {
namespace {

// What the runtime's own text does not say about the errors that mean "no usable CUDA".
std::string no_device_advice(cudaError_t error)
{
  switch (error) {
    case cudaErrorInsufficientDriver:
      return std::string{"the CUDA driver is older than the CUDA runtime asyncmr was built with ("} +
             std::to_string(CUDART_VERSION / 1000) + "." +
             std::to_string(CUDART_VERSION % 1000 / 10) +
             "): upgrade the driver, or install the asyncmr variant for your CUDA";
    case cudaErrorStubLibrary:
      return "the CUDA driver library found is a stub: no NVIDIA driver is installed";
    case cudaErrorDevicesUnavailable:
      return "every CUDA device is busy or unavailable (exclusive compute mode?)";
    default: {
      char const* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      return visible != nullptr ? std::string{"no CUDA device is visible (CUDA_VISIBLE_DEVICES='"} +
                                    visible + "')"
                                : std::string{"no CUDA device is visible"};
    }
  }
}

}  // namespace

void throw_cuda_error(cudaError_t error, char const* call)
{
  // One refused call must not make the next, unrelated, check fail; a user's own pending error
  // is left alone.
  clear_own_error(error);
  std::string const what = std::string{call} + " failed: " + cudaGetErrorName(error) + " (" +
                           cudaGetErrorString(error) + ")";
  switch (error) {
    case cudaErrorMemoryAllocation: throw rmm::out_of_memory{"asyncmr: out of memory: " + what};
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
      throw no_device_error{"asyncmr: " + what + "; " + no_device_advice(error)};
    case cudaErrorNotSupported: throw unsupported_error{"asyncmr: " + what};
    default: throw cuda_error{error, "asyncmr: " + what};
  }
}

}  // namespace asyncmr::detail
