/*
 * SPDX-License-Identifier: Apache-2.0
 */
#include <asyncmr/capability.hpp>
#include <asyncmr/error.hpp>

#include <string>

namespace asyncmr::detail {

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
      // require_cuda() builds the message that says which of these it is.
      require_cuda();
      throw no_device_error{"asyncmr: " + what};
    case cudaErrorNotSupported: throw unsupported_error{"asyncmr: " + what};
    default: throw cuda_error{error, "asyncmr: " + what};
  }
}

}  // namespace asyncmr::detail
