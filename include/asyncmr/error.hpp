/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/**
 * @file error.hpp
 * @brief The exceptions asyncmr throws, and the one place where a `cudaError_t` becomes one.
 */

#include <rmm/error.hpp>

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace asyncmr {

/**
 * @brief A CUDA call failed. `what()` names the call and the CUDA error (e.g.
 * `cudaMemPoolSetAttribute(...) failed: cudaErrorInvalidValue (invalid argument)`).
 *
 * Derives from `rmm::cuda_error` so code that already catches RMM's errors catches ours.
 */
class cuda_error : public rmm::cuda_error {
 public:
  cuda_error(cudaError_t code, std::string const& msg) : rmm::cuda_error{msg}, code_{code} {}
  /// @brief The CUDA error code the driver returned.
  [[nodiscard]] cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

/**
 * @brief The process has no usable CUDA: no driver, no visible device, or a driver older than
 * the CUDA runtime asyncmr was built with. Nothing was changed.
 */
class no_device_error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/**
 * @brief The driver, runtime or device does not support what was asked (for example a CUDA 13.2
 * pool attribute on a 13.0 driver, or managed pools in a CUDA 12 build).
 */
class unsupported_error : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// @brief A pool was used after `mem_pool::close()` destroyed it.
class pool_closed_error : public std::logic_error {
  using std::logic_error::logic_error;
};

namespace detail {

/**
 * @brief Throws the exception that fits `error`, with the failing call's text in the message.
 *
 * `cudaErrorMemoryAllocation` becomes `rmm::out_of_memory`; missing drivers and devices become
 * `no_device_error`; `cudaErrorNotSupported` becomes `unsupported_error`; the rest `cuda_error`.
 * The runtime's last-error slot is cleared of `error` (`clear_own_error`), so later calls
 * start clean.
 */
[[noreturn]] void throw_cuda_error(cudaError_t error, char const* call);

/**
 * @brief Clears the runtime's (non-sticky) last-error slot if it holds `status`, the error
 * asyncmr's own call just returned. A success clears nothing, so an error a user's earlier,
 * unrelated call left pending is still there for the user to read.
 */
inline void clear_own_error(cudaError_t status) noexcept
{
  if (status != cudaSuccess && cudaPeekAtLastError() == status) {
    static_cast<void>(cudaGetLastError());
  }
}

}  // namespace detail
}  // namespace asyncmr

/**
 * @brief Evaluates a CUDA runtime call and throws through `asyncmr::detail::throw_cuda_error`
 * when it fails.
 */
#define ASYNCMR_CUDA_TRY(call)                                                        \
  do {                                                                                \
    cudaError_t const asyncmr_status_ = (call);                                       \
    if (asyncmr_status_ != cudaSuccess) {                                             \
      ::asyncmr::detail::throw_cuda_error(asyncmr_status_, #call);                    \
    }                                                                                 \
  } while (0)
