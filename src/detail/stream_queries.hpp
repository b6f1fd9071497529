/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// What the front cache asks the driver about a stream or a pointer, on its hit path: each asked
// of the driver's entry points directly (a runtime stream query costs more: cache_bench
// "calls"), the runtime answering where the driver cannot.

#include <asyncmr/detail/block_cache.hpp>

#include <cuda_runtime_api.h>

#include <optional>

namespace asyncmr::detail {

/// True when `stream` is capturing, or when that cannot be told (then the cache stays out).
[[nodiscard]] bool stream_capturing(cudaStream_t stream) noexcept;

/**
 * Whether `stream` names the legacy default stream, which is never capturing: a capture cannot
 * begin there. The front cache so asks no capture question about it (one driver call each hit
 * and put: cache_bench "calls"), and more than time: while a blocking stream
 * of the device captures, the driver answers any question about the legacy stream with
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (cuStreamIsCapturing's documentation), which
 * `stream_capturing` reads as "cannot be told", and the cache would then go to the pool on the legacy
 * stream, a call the capture cannot survive. Handle 0 is the legacy stream here: this library is
 * not built for per-thread default streams, and the driver reads 0 the same way.
 */
[[nodiscard]] inline bool legacy_stream(cudaStream_t stream) noexcept
{
  return stream == nullptr || stream == cudaStreamLegacy;
}

/**
 * Whether work may be queued on the legacy stream `stream` now: cudaSuccess, or the driver's
 * refusal, cudaErrorStreamCaptureImplicit while a blocking stream of the current context
 * captures (a call queued there then would fail and invalidate that capture). One driver call
 * (cuStreamIsCapturing), asked before the cache's own calls on the legacy stream (a put's marker,
 * a miss), so that they are refused instead, and the capture is left valid.
 */
[[nodiscard]] cudaError_t legacy_stream_open(cudaStream_t stream) noexcept;

/// The stream's id, unique for the life of the process (special handles resolve to the calling
/// thread's or current context's stream); false when neither the driver nor the runtime can say.
[[nodiscard]] bool stream_key_of(cudaStream_t stream, stream_key& key) noexcept;

/// The pool the driver says `ptr` was allocated from: a handle, nullptr when it names none
/// (cudaMalloc memory, host memory), or nothing when it cannot be asked.
[[nodiscard]] std::optional<cudaMemPool_t> pool_of_pointer(void* ptr) noexcept;

/// cudaEventRecord, asked of the driver first (it is on every free into the cache).
[[nodiscard]] cudaError_t record_event(cudaEvent_t event, cudaStream_t stream) noexcept;

}  // namespace asyncmr::detail
