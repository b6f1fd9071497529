/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

/// @file front_cache_stats.hpp
/// @brief What a resource's front cache reports (`pool_resource::cache_stats()`).

#include <cstddef>
#include <cstdint>

namespace asyncmr {

/// @brief Counters of one front cache, summed over its streams when read.
struct front_cache_stats {
  std::uint64_t hits{};                  ///< allocations served from the cache
  std::uint64_t misses{};                ///< cacheable allocations the pool served
  std::uint64_t refused_cap{};           ///< frees the cap turned away (freed to the pool)
  std::uint64_t refused_uncacheable{};   ///< frees of sizes the cache does not hold
  std::uint64_t refused_not_recorded{};  ///< frees of blocks the cache did not hand out
  std::uint64_t refused_wrong_size{};    ///< frees naming another size class than the record
  std::uint64_t refused_double_free{};   ///< frees of a block that is already cached
  std::uint64_t refused_unmarked{};  ///< frees whose stream could not be marked (freed to the pool)
  /// Frees the cache had no host memory to file (a block list, a stream's bucket): freed to the
  /// pool. Not pressure on the cap, so they never ask for a reclaim of idle streams' blocks.
  std::uint64_t refused_no_memory{};
  std::uint64_t untracked{};  ///< blocks handed out that the record had no room for (never cached)
  std::uint64_t reclaims{};   ///< reclaims of idle streams' blocks that found some
  std::uint64_t reclaimed_blocks{};  ///< blocks those reclaims took back
  std::size_t cached_bytes{};        ///< bytes of cached blocks now (class sizes)
  std::size_t cached_blocks{};       ///< number of cached blocks now
  std::size_t parked_bytes{};        ///< bytes of blocks taken out, their frees not yet made
  std::size_t parked_blocks{};       ///< number of such blocks
  std::size_t recorded_blocks{};     ///< blocks the ownership record holds (handed out, cached, parked)
  /// Bytes charged against the cap now: cached and parked bytes plus the streams' credit.
  std::size_t charged_bytes{};
  /// Peak of `charged_bytes` since construction or a reset: an upper bound of the peak of cached
  /// bytes that needs no shared counter on the hit path; never above the cap.
  std::size_t charged_high{};
  /// Streams the cache has a bucket for now (with blocks, credit, or neither: an emptied
  /// bucket stays its stream's until that stream is idle for a stale reclaim's epoch, or the
  /// bucket is taken for a new stream)
  std::size_t streams{};
};

}  // namespace asyncmr
