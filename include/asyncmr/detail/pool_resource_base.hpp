/*
 * SPDX-License-Identifier: Apache-2.0
 */
#pragma once

#include <asyncmr/detail/front_cache.hpp>
#include <asyncmr/location.hpp>
#include <asyncmr/mem_pool.hpp>

#include <rmm/aligned.hpp>

#include <cuda/stream>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace asyncmr {

/**
 * @brief How many stream-ordered frees through asyncmr's resources the driver refused since the
 * process started (each one is also logged through RMM's logger).
 */
[[nodiscard]] std::uint64_t failed_deallocations() noexcept;

namespace detail {

/// @brief Everything a resource constructor decides about its pool.
struct pool_request {
  allocation_type type;
  asyncmr::location location;
  pool_source source{pool_source::default_pool};
  /// Unset: shared pools with threshold 0 are raised to the maximum, owned pools get the
  /// maximum. Set: applied exactly, whatever the pool.
  std::optional<std::uint64_t> release_threshold{};
  /// Devices to grant read-write access to; unset = every visible device. Only host pools.
  std::optional<std::vector<int>> accessible_from{};
  int device{0};  ///< device the capability checks are made for
};

/// @brief Obtains the pool `request` describes and applies the threshold and access policy.
[[nodiscard]] mem_pool acquire_pool(pool_request const& request);

/**
 * @brief Applies the policy to a pool the caller handed in (adopted): the threshold only when
 * given, and access grants for host pools.
 */
void configure_adopted_pool(mem_pool& pool,
                            std::optional<std::uint64_t> release_threshold,
                            std::optional<std::vector<int>> const& accessible_from,
                            bool host_pool);

struct capture_blocks;

/**
 * @brief What the three resources share: stream-ordered allocation from one `mem_pool`
 * (`cudaMallocFromPoolAsync` / `cudaFreeAsync`), optionally behind a per-stream front cache,
 * and the pool itself. Copies share the pool and the cache.
 *
 * The front cache (`cache` bytes > 0) keeps freed blocks per stream, in size classes, and hands
 * a block freed on stream S only to a later allocation on S (stream order makes that safe with
 * no event). Streams are told apart by `cudaStreamGetId`, so the per-thread default stream of
 * two threads, or a new stream that reuses a destroyed stream's handle, never share blocks.
 * While a stream captures, the cache is bypassed, and a block allocated inside a capture is
 * never cached. Cached blocks count as used in the pool's attributes; `cache_stats()` reports
 * them on their own. `trim_to` and destruction synchronize every device, then free the cached
 * blocks to the pool. A double free of a cached size is not detected by the cache.
 */
class pool_resource_base {
 public:
  /**
   * @brief Allocates `bytes` bytes in stream order on `stream`. Zero bytes returns nullptr.
   * @throws rmm::out_of_memory when the pool cannot grow; `unsupported_error` when CUDA refuses
   * the allocation inside a stream capture (host pools); `pool_closed_error` after close.
   */
  [[nodiscard]] void* allocate(cuda::stream_ref stream,
                               std::size_t bytes,
                               std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT);
  /**
   * @brief Frees `ptr` in stream order on `stream`. Never throws: a free the driver refuses (a
   * double free, a pointer no pool handed out) is logged through RMM's logger, counted in
   * `failed_deallocations()`, and asserted in debug builds, as RMM does.
   */
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept;
  /**
   * @brief Frees like `deallocate`, and returns the driver's answer instead of logging a
   * refusal (refusals still count in `failed_deallocations()`); for callers that can raise.
   */
  [[nodiscard]] cudaError_t deallocate_checked(cuda::stream_ref stream,
                                               void* ptr,
                                               std::size_t bytes) noexcept;
  /// @brief Allocates and waits until the memory is usable from the host and any stream.
  [[nodiscard]] void* allocate_sync(std::size_t bytes,
                                    std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT);
  /// @brief Frees memory no stream still uses.
  void deallocate_sync(void* ptr,
                       std::size_t bytes,
                       std::size_t alignment = rmm::CUDA_ALLOCATION_ALIGNMENT) noexcept;

  /// @brief The pool this resource allocates from.
  [[nodiscard]] mem_pool const& pool() const noexcept { return pool_; }
  /// @brief The pool's driver handle.
  [[nodiscard]] cudaMemPool_t pool_handle() const { return pool_.handle(); }
  /// @brief True if the pool is destroyed with the resource (`pool_source::new_pool`).
  [[nodiscard]] bool owns_pool() const noexcept { return pool_.owned(); }

  /// @brief The front cache's byte cap; 0 without a cache.
  [[nodiscard]] std::size_t cache_capacity() const noexcept;
  /// @brief The front cache's counters (cached bytes and blocks, hits, ...); none without one.
  [[nodiscard]] std::optional<front_cache_stats> cache_stats() const;
  /**
   * @brief Empties the front cache: synchronizes every visible device (so no stream still uses
   * a cached block), then frees the cached blocks to the pool. Process-wide effect: the device
   * synchronizations.
   */
  void release_cache();
  /**
   * @brief Empties the front cache (`release_cache`), then releases the pool's unused reserved
   * memory down to `min_bytes_to_keep` bytes (`mem_pool::trim_to`).
   */
  void trim_to(std::size_t min_bytes_to_keep = 0);

 protected:
  explicit pool_resource_base(mem_pool pool, std::size_t cache_bytes = 0);
  ~pool_resource_base();
  pool_resource_base(pool_resource_base const&)            = default;
  pool_resource_base& operator=(pool_resource_base const&) = default;
  pool_resource_base(pool_resource_base&&) noexcept        = default;
  pool_resource_base& operator=(pool_resource_base&&) noexcept = default;

  [[nodiscard]] bool same_pool(pool_resource_base const& other) const noexcept
  {
    return pool_ == other.pool_;
  }

 private:
  struct cache_state;
  mem_pool pool_;
  // Shared by copies; the last copy empties the cache.
  std::shared_ptr<cache_state> cache_;
};

}  // namespace detail
}  // namespace asyncmr
