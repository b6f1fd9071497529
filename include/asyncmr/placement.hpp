/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/// @file placement.hpp
/// @brief Moving managed memory, in stream order: prefetch, discard, discard-and-prefetch; and a
/// managed resource's placement of each allocation (`resource_options::prefetch`).

#include <asyncmr/location.hpp>

#include <cuda/stream>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace asyncmr {

/// @brief A range of managed memory: its start and its size in bytes.
struct memory_range {
  void* ptr{nullptr};
  std::size_t bytes{0};
};

/**
 * @brief Prefetches each range to `to` (a device or the host) in stream order on `stream`, one
 * `cudaMemPrefetchAsync` per range: a loop is never slower than the batched call (benchmark
 * section 12 measures both). Ranges of 0 bytes are skipped.
 * @throws unsupported_error when `stream` is capturing (the driver would invalidate the capture);
 * std::invalid_argument for a bad `to`, a null range, or a range the driver refuses (not managed
 * memory), naming its index: the ranges before it are already queued, nothing else changed
 */
void prefetch(std::span<memory_range const> ranges, location to, cuda::stream_ref stream);

/**
 * @brief Discards the contents of each range in stream order on `stream`
 * (`cudaMemDiscardBatchAsync`): no migration; reading a discarded range before writing it gives
 * unspecified values. Ranges of 0 bytes are skipped.
 * @throws unsupported_error on a build for a CUDA 12 runtime (needs the CUDA 13 build), or when
 * `stream` is capturing; std::invalid_argument as for `prefetch`
 */
void discard(std::span<memory_range const> ranges, cuda::stream_ref stream);

/**
 * @brief Discards each range and prefetches it to `to`, in one call
 * (`cudaMemDiscardAndPrefetchBatchAsync`, faster than the prefetch alone: benchmark section 12):
 * for memory about to be overwritten where it will be used.
 * @throws as `discard`
 */
void discard_and_prefetch(std::span<memory_range const> ranges,
                          location to,
                          cuda::stream_ref stream);

/// @brief The kinds of `cudaMemAdvise` (each names the `cudaMemoryAdvise` it passes).
enum class memory_advice {
  set_read_mostly,           ///< cudaMemAdviseSetReadMostly (the location is not used)
  unset_read_mostly,         ///< cudaMemAdviseUnsetReadMostly (the location is not used)
  set_preferred_location,    ///< cudaMemAdviseSetPreferredLocation
  unset_preferred_location,  ///< cudaMemAdviseUnsetPreferredLocation (the location is not used)
  set_accessed_by,           ///< cudaMemAdviseSetAccessedBy
  unset_accessed_by,         ///< cudaMemAdviseUnsetAccessedBy
};

/// @brief The advice's name as the Python API spells it ("set_read_mostly", ...).
[[nodiscard]] char const* to_string(memory_advice advice) noexcept;

/**
 * @brief Gives the driver `advice` about each range (`cudaMemAdvise`, one call per range; not
 * stream-ordered: it applies when the call returns). Made in relaxed capture mode, so another
 * thread's capture stays valid. Ranges of 0 bytes are skipped.
 *
 * Managed *pool* memory takes no advice on the drivers measured (580: every kind, either target,
 * `cudaErrorNotSupported`, docs/DRIVER_FACTS.md); for it the pool's own settings are what work:
 * its location (where new pages go), `set_access`, and `prefetch`. Advice works on
 * `cudaMallocManaged` memory.
 * @throws std::invalid_argument for a bad `to` or a null range, before any driver call, and for
 * a range the driver refuses as not managed memory, naming its index (the ranges before it were
 * advised); unsupported_error when the driver takes no advice on a range (memory-pool memory),
 * naming what to use instead
 */
void advise(std::span<memory_range const> ranges, memory_advice advice, location to);

/// @brief True when this build of asyncmr can discard (`discard`, `discard_and_prefetch`): the
/// CUDA 13 one.
[[nodiscard]] bool can_discard() noexcept;

/**
 * @brief How many prefetches of new allocations (`resource_options::prefetch`) the driver
 * refused since the process started; each left its allocation as it was.
 */
[[nodiscard]] std::uint64_t failed_prefetches() noexcept;

/**
 * @brief Where a managed resource places each allocation it hands out (`resource_options::
 * prefetch` and `::discard`): the part of `pool_resource` that prefetches every new block to
 * `target()` on its own stream, dropping its old contents first when `discards()`.
 */
class allocation_placement {
 public:
  /// @brief Places at `to` (checked by the caller: a device or the host); `discard`: drop the
  /// old contents as they move (CUDA 13 build; a plain prefetch on the legacy stream).
  allocation_placement(location to, bool discard) noexcept : to_{to}, discard_{discard} {}
  [[nodiscard]] location target() const noexcept { return to_; }
  [[nodiscard]] bool discards() const noexcept { return discard_; }
  /**
   * @brief Places the `bytes` bytes at `ptr` on `stream`. Nothing on a capturing stream (a
   * prefetch there invalidates the capture: a graph's allocation is not placed); a refusal is
   * counted in `failed_prefetches()` and leaves the block as it was. Never throws.
   */
  void place(void* ptr, std::size_t bytes, cudaStream_t stream) const noexcept;

 private:
  location to_;
  bool discard_;
};

}  // namespace asyncmr
