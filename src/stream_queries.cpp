/*
 * SPDX-License-Identifier: Apache-2.0
 */

// What the front cache asks the driver (detail/stream_queries.hpp).

#include "detail/stream_queries.hpp"

#include "detail/driver_api.hpp"

#include <asyncmr/error.hpp>

#include <type_traits>

namespace asyncmr::detail {
namespace {

// The runtime's special handles are the driver's (cudaStreamLegacy = CU_STREAM_LEGACY,
// cudaStreamPerThread = CU_STREAM_PER_THREAD, 0 = the legacy stream in code not built for
// per-thread default streams). The driver needs a current context for those; without one it
// refuses, and the runtime answers (and makes the context current for the next time).
struct driver_queries {
  int (*is_capturing)(cudaStream_t, int*)          = nullptr;  // cuStreamIsCapturing
  int (*get_id)(cudaStream_t, unsigned long long*) = nullptr;  // cuStreamGetId
  int (*record)(cudaEvent_t, cudaStream_t)         = nullptr;  // cuEventRecord
};

driver_queries const& queries() noexcept
{
  static driver_queries const q = [] {
    driver_queries d;
    auto find = [](char const* symbol, int version, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
        driver_entry_point(symbol, version));
    };
    find("cuStreamIsCapturing", 10000, d.is_capturing);
    find("cuStreamGetId", 12000, d.get_id);
    find("cuEventRecord", 2000, d.record);
    return d;
  }();
  return q;
}

constexpr int pointer_attribute_mempool_handle = 17;  // CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE

// The one capture question both answers below ask: cudaSuccess with `capturing` set, or the
// error the question got. The driver is asked first (no runtime error state to clear); the
// runtime answers where the driver cannot (a special handle with no current context), except
// for CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, which the runtime would only repeat.
cudaError_t ask_capturing(cudaStream_t stream, bool& capturing) noexcept
{
  constexpr int capture_implicit = 906;  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
  capturing                      = false;
  if (auto* const is_capturing = queries().is_capturing) {
    int status       = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
    auto const error = is_capturing(stream, &status);
    if (error == 0) {
      capturing = status != 0;
      return cudaSuccess;
    }
    if (error == capture_implicit) { return cudaErrorStreamCaptureImplicit; }
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  auto const e                   = cudaStreamIsCapturing(stream, &status);
  clear_own_error(e);
  capturing = e == cudaSuccess && status != cudaStreamCaptureStatusNone;
  return e;
}

}  // namespace

bool stream_capturing(cudaStream_t stream) noexcept
{
  bool capturing = false;
  return ask_capturing(stream, capturing) != cudaSuccess || capturing;
}

cudaError_t legacy_stream_open(cudaStream_t stream) noexcept
{
  bool capturing = false;  // the legacy stream itself never captures
  return ask_capturing(stream, capturing);
}

bool stream_key_of(cudaStream_t stream, stream_key& key) noexcept
{
  unsigned long long id = 0;
  if (auto* const get_id = queries().get_id; get_id != nullptr && get_id(stream, &id) == 0) {
    key = id;
    return true;
  }
  auto const e = cudaStreamGetId(stream, &id);
  clear_own_error(e);
  key = id;
  return e == cudaSuccess;
}

std::optional<cudaMemPool_t> pool_of_pointer(void* ptr) noexcept
{
  void* pool = nullptr;
  if (pointer_attribute(&pool, pointer_attribute_mempool_handle, ptr) != 0) {
    return std::nullopt;
  }
  return static_cast<cudaMemPool_t>(pool);
}

cudaError_t record_event(cudaEvent_t event, cudaStream_t stream) noexcept
{
  if (auto* const record = queries().record; record != nullptr && record(event, stream) == 0) {
    return cudaSuccess;
  }
  return cudaEventRecord(event, stream);
}

}  // namespace asyncmr::detail
