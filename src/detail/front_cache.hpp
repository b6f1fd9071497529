/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

// Private to src/: the front cache, the part of a `pool_resource` that keeps freed blocks per
// stream (`resource_options::cache`; its rules: docs/user_guide/front_cache.md). Its mechanism,
// with no CUDA in it, is the block cache (include/asyncmr/detail/block_cache.hpp); this binds it
// to CUDA streams and to one pool: stream keys and capture status asked of the driver, the pool
// behind every miss, the driver's word on pointers the cache did not hand out, the markers (an
// event per stream) and the release stream that parked blocks go back on, the background reclaim
// of idle streams' blocks, and giving cached memory back when the pool runs out or closes.

#include <asyncmr/detail/block_cache.hpp>
#include <asyncmr/pool_resource.hpp>
#include <asyncmr/mem_pool.hpp>

#include "device_sync.hpp"
#include "pool_state.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <optional>

namespace asyncmr::detail {

// A front cache's own stream, made in the context of its device, which nobody captures (see
// "Markers" in block_cache.hpp): parked blocks are freed on `stream` after it waited for their
// streams' markers. Also the key of that context's legacy stream, taken when it was made (the
// driver answers no question about the legacy stream while a blocking stream captures). The
// cache destroys the stream last, after its markers.
struct release_stream {
  explicit release_stream(std::optional<int> device);
  ~release_stream() { destroy(); }
  release_stream(release_stream const&)            = delete;
  release_stream& operator=(release_stream const&) = delete;

  cudaStream_t stream{nullptr};
  std::optional<stream_key> legacy;  // the legacy stream's key in that context
  void* context{nullptr};            // that context (CUcontext), or nullptr if none was current

 private:
  void destroy() noexcept;
};

class front_cache final : public std::enable_shared_from_this<front_cache> {
 public:
  /// A cache of `cap` bytes in front of `pool`; `device` (when the pool's memory lives on one)
  /// is where its frees run. Registered so that any allocation from the same pool that runs out
  /// of memory can ask for the cached memory back.
  [[nodiscard]] static std::shared_ptr<front_cache> make(mem_pool pool,
                                                          std::size_t cap,
                                                          std::optional<int> device);
  front_cache(mem_pool pool, std::size_t cap, std::optional<int> device);
  /// Queues the frees of every cached block on the release stream (waits for nothing).
  ~front_cache();
  front_cache(front_cache const&)            = delete;
  front_cache& operator=(front_cache const&) = delete;

  /// A hit, or a miss allocated from the pool at its class size (recorded); a stream that
  /// captures gets a graph allocation of exactly `bytes`, never recorded. `*hit` (when given) is
  /// set on a hit.
  [[nodiscard]] void* allocate(cudaStream_t stream, std::size_t bytes, bool* hit = nullptr);
  /// Caches a block the cache handed out, frees anything else of this pool to the pool, and
  /// refuses what is not this pool's or names the wrong size. Never throws.
  [[nodiscard]] free_result deallocate(cudaStream_t stream, void* ptr, std::size_t bytes) noexcept;
  /// Parks every cached block (the release stream waiting for each one's stream), frees them on
  /// the release stream and waits for it (in a blocking region), also for frees queued there
  /// before (by the reclaimer, or a release on another thread): the memory is the pool's when
  /// it returns. Safe while any other stream captures. The wait's error comes back. Never throws.
  cudaError_t release() noexcept;
  /// The background reclaimer's job: parks the blocks of streams idle for a whole epoch and
  /// frees them on the release stream, waiting for nothing.
  void reclaim_stale() noexcept;

  [[nodiscard]] front_cache_stats stats() const noexcept { return cache_.stats(); }
  [[nodiscard]] std::size_t cap() const noexcept { return cache_.cap(); }
  /// Bytes charged against the cap now (cached, parked, and the streams' credit): one load.
  [[nodiscard]] std::size_t charged_bytes() const noexcept { return cache_.charged_bytes(); }
  /// The pool's driver handle when the cache was made: still its pool's after a close.
  [[nodiscard]] cudaMemPool_t made_for() const noexcept { return made_for_; }

 private:
  /// Parks the cached blocks (every one, or the stale streams') and queues their frees on the
  /// release stream, waiting for nothing; returns how many.
  std::size_t free_in_release_order(bool stale) noexcept;
  /// The cache's key for `stream`: the driver's stream id, or for the legacy stream of the
  /// cache's own context the key taken when the cache was made. False when neither is known.
  [[nodiscard]] bool key_for(cudaStream_t stream, stream_key& key) const noexcept;

  // Made current by the destructor's body and declared first, so destroyed last: the members'
  // destruction (the cache's markers, its streams, the pool) runs in the cache's device's
  // context, whichever thread drops the last owner (the reclaimer's has none of its own).
  std::optional<active_context_scope> ending_;
  mem_pool pool_;
  cudaMemPool_t made_for_;  // pool_'s driver handle when the cache was made (before any close)
  std::optional<int> device_;
  release_stream release_;
  block_cache cache_;
};

/// What `release_caches_of` did: how many caches' releases waited for their frees (every free
/// they had queued, also those of blocks they no longer counted as cached), and how many blocks
/// were still cached when each began.
struct caches_given_back {
  std::size_t caches{0};
  std::size_t blocks{0};
};

/**
 * Gives the memory every live cache made for `pool` holds back to it (`front_cache::release`);
 * for an allocation from `pool` that ran out of memory, which is worth trying again whenever a
 * release waited (`caches` != 0), and for a pool that is being closed. `except` is skipped
 * (already asked).
 */
[[nodiscard]] caches_given_back release_caches_of(cudaMemPool_t pool, front_cache const* except) noexcept;

/**
 * `pool.allocate_async(bytes, stream)`; when the pool runs out of memory, the caches on it give
 * their blocks back (`release_caches_of`) and the allocation is tried once more. For every
 * allocation from a pool that does not go through a cache's own hit-or-miss path.
 */
[[nodiscard]] void* allocate_giving_caches_back(mem_pool const& pool,
                                                std::size_t bytes,
                                                cudaStream_t stream);

/// `pool.deallocate_async(ptr, stream)` as a `free_result` (a refusal is `driver_refused`).
[[nodiscard]] free_result free_to_pool(mem_pool const& pool, void* ptr, cudaStream_t stream) noexcept;

/// Asks the background reclaimer to run `cache.reclaim_stale()` soon (at most one pending
/// request per cache). Never throws; a request that cannot be queued is dropped.
void request_reclaim(std::weak_ptr<front_cache> cache) noexcept;

}  // namespace asyncmr::detail
